"""`vllm-spark bench` end to end against the fake OpenAI server on the wall clock
(vllm_spark_plugin/testbed/fake_server.py): the whole command, its files, its failure paths (a dying,
silent or wrong server, Ctrl-C) and its rates with a tolerance.  These wait on real time (steps of
milliseconds, sweeps of seconds) or start processes, so they are not unit tests; the exact rates,
knee and capacity are asserted on the fake's simulated clock in tests/unit/test_bench_fake.py.
"""
from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image
from support.fake_bench import bench, rows

from vllm_spark_plugin.bench.results import CSV_COLUMNS
from vllm_spark_plugin.cli import main as vllm_spark
from vllm_spark_plugin.definitions import SweepPoint, capacity_at_floor

ROOT = Path(__file__).resolve().parents[2]
REQUIRED_COLUMNS = ["row_type", "label", "workload", "endpoint", "model", "mode", "concurrency", "trial",
                    "requests", "completed", "errors", "short_streams", "per_stream_median_tps",
                    "per_stream_min_tps", "per_stream_p10_tps", "aggregate_tps", "ttft_p50_s", "ttft_p90_s",
                    "ttft_p99_s", "output_tokens", "prompt_tokens", "duration_s"]
TOKENS = 20  # per request: enough for a rate, few enough that the wall-clock sweep takes seconds


def test_rates_match_known_timings_and_all_outputs_written(fake, tmp_path, capsys):
    alpha, beta = 0.010, 0.001
    srv = fake(alpha=alpha, beta=beta)
    out = tmp_path / "run"
    rc = bench("--endpoint", srv.base_url, "--levels", "1,2,4,8,16", "--trials", "2", "--workload", "code",
               "--output-tokens", str(TOKENS), "--floor", "20,50", "--out", str(out))
    assert rc == 0
    stdout = capsys.readouterr().out

    header = next(csv.reader(open(out / "sweep.csv")))
    assert header == CSV_COLUMNS and set(REQUIRED_COLUMNS) <= set(header)
    points, trials = rows(out, "point"), rows(out, "trial")
    assert [int(p["concurrency"]) for p in points] == [1, 2, 4, 8, 16]
    assert len(trials) == 10 and {t["trial"] for t in trials} == {"1", "2"}
    # The client times tokens on the wall clock, where a busy machine only makes the fake's steps
    # later: rates are bounded above by the engine's (with slack for the client's own delays) and
    # below with room for a slow machine (a quarter: the box once ran this at 0.48 of the engine's
    # rate with stray servers loading it).  The exact rates, knee and capacity: the sweep on the
    # simulated clock (test_sweep_on_the_simulated_clock_gives_the_exact_curve_knee_and_capacity).
    for p in points:
        c = int(p["concurrency"])
        step = alpha + beta * c
        assert 0.25 / step <= float(p["per_stream_median_tps"]) <= 1.10 / step, p
        assert 0.25 * c / step <= float(p["aggregate_tps"]) <= 1.12 * c / step, p
        assert float(p["per_stream_min_tps"]) <= float(p["per_stream_median_tps"])
        assert 0 < float(p["ttft_p50_s"]) <= float(p["ttft_p90_s"]) <= float(p["ttft_p99_s"]) < 1.0
        assert int(p["requests"]) == int(p["completed"]) == 2 * c and int(p["errors"]) == 0
        assert int(p["short_streams"]) == 0
        assert int(p["output_tokens"]) == 2 * c * TOKENS
        assert p["engine_version"] == "0.0.0-fake" and p["max_model_len"] == "8192"
        assert "gpu_memory_utilization=0.5" in p["recipe"] and p["model"] == "fake-model"

    streams = list(csv.DictReader(open(out / "streams.csv")))  # every measured request, individually
    assert len(streams) == sum(int(t["requests"]) for t in trials) == 62
    for r in streams:
        step = alpha + beta * int(r["concurrency"])
        assert int(r["output_tokens"]) == TOKENS and r["short"] == "0" and r["bunched"] == "0" and not r["error"]
        assert 0.25 / step <= float(r["decode_tps"]) <= 1.15 / step
        assert float(r["decode_tps"]) == pytest.approx((TOKENS - 1) / float(r["decode_s"]), rel=1e-4)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["complete"] is True
    curve = summary["curves"][0]
    measured = [SweepPoint(concurrency=int(p["concurrency"]), aggregate_tokens_per_second=float(p["aggregate_tps"]),
                           per_stream_tokens_per_second=float(p["per_stream_median_tps"])) for p in points]
    expected_capacity = {"20": capacity_at_floor(measured, 20), "50": capacity_at_floor(measured, 50)}
    assert curve["capacity"] == expected_capacity and expected_capacity["20"] == 16  # 1/(a+16b) = 38.5 >= 20
    assert curve["knee"]["knee"] >= 1 and curve["knee"]["plateau_tokens_per_second"] > 0
    assert "highest concurrency with median per-stream rate >= 20 tok/s: 16" in stdout

    profile = json.loads((out / "capacity_profile.json").read_text())
    for key in ("knee", "plateau_tokens_per_second", "alpha_seconds", "beta_seconds", "capacity", "model",
                "endpoint", "date", "source"):
        assert key in profile, key
    assert profile["capacity"] == expected_capacity and profile["model"] == "fake-model"
    assert profile["knee"] == curve["knee"]["knee"] and profile["endpoint"] == srv.base_url

    # the colleague formats read what the benchmark writes: `vllm-spark knee` and the exporter
    from prometheus_client import CollectorRegistry

    from vllm_spark_plugin.knee.loaders import load_points
    from vllm_spark_plugin.metrics import instruments, knee_gauges
    (curve_points,) = load_points(out / "sweep.csv").values()
    assert [(p.concurrency, p.trials) for p in curve_points] == [(c, 2) for c in (1, 2, 4, 8, 16)]
    assert [p.per_stream_tokens_per_second for p in curve_points] == [float(p["per_stream_median_tps"])
                                                                       for p in points]
    registry = CollectorRegistry()
    assert knee_gauges.load_profile(instruments.Instruments(registry), "bench-test-model",
                                    str(out / "capacity_profile.json"))
    assert registry.get_sample_value("vllm_spark_profile_knee_batch_size",
                                     {"model_name": "bench-test-model"}) == pytest.approx(profile["knee"])
    assert registry.get_sample_value("vllm_spark_profile_capacity_streams",
                                     {"model_name": "bench-test-model", "floor": "50"}) == 8

    meta = json.loads((out / "meta.json").read_text())
    assert meta["servers"][0]["engine_version"] == "0.0.0-fake" and meta["status"] == "complete"
    assert meta["workloads"][0] == {"name": "code", "output_tokens": TOKENS, "temperature": 0.0, "input_tokens": None}

    for name in ("aggregate.png", "per_stream.png", "ttft.png"):
        img = Image.open(out / name).convert("RGB")
        assert img.size[0] > 400 and len(img.getcolors(1 << 20) or []) > 20, name
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    assert "highest concurrency with median per-stream rate &gt;= 20 tok/s: 16" in html
    assert "Partial results" not in html


def test_closed_loop_counts_tokens_from_usage_with_multi_token_chunks(fake, tmp_path):
    alpha, beta, k, n = 0.008, 0.001, 4, 41
    srv = fake(alpha=alpha, beta=beta, tokens_per_chunk=k)
    out = tmp_path / "run"
    rc = bench("--endpoint", srv.base_url, "--mode", "closed-loop", "--levels", "4", "--requests", "8",
               "--trials", "1", "--no-warmup", "--api", "completions", "--workload", "random",
               "--random-input-len", "32", "--output-tokens", str(n), "--out", str(out))
    assert rc == 0
    (p,) = rows(out, "point")
    assert p["mode"] == "closed-loop" and p["api"] == "completions"
    assert int(p["requests"]) == 8 and int(p["output_tokens"]) == 8 * n  # usage, not 11 chunks each
    assert int(p["prompt_tokens"]) == 8 * 32  # exact-length token-id prompts
    assert srv.max_batch_seen == 4  # never more than 4 in flight
    # first chunk after k tokens, last after n: (n-1) tokens over (n-k) steps (exact: the simulated
    # clock's test_multi_token_chunks_...); on the wall clock, bounded above with slack
    step = alpha + beta * 4
    assert 0.5 <= float(p["per_stream_median_tps"]) / ((n - 1) / ((n - k) * step)) <= 1.12


def test_short_streams_flagged_not_averaged(fake, tmp_path, capsys):
    srv = fake(alpha=0.005, beta=0.0005, eos_after=10)
    out = tmp_path / "run"
    assert bench("--endpoint", srv.base_url, "--levels", "2", "--trials", "1", "--no-warmup", "--workload",
                 "prose", "--output-tokens", "30", "--no-ignore-eos", "--out", str(out)) == 0
    (p,) = rows(out, "point")
    assert int(p["short_streams"]) == 2 and int(p["completed"]) == 2
    assert p["per_stream_median_tps"] == "" and p["ignore_eos"] == "0"
    out2 = tmp_path / "run2"  # the default sends ignore_eos: outputs are as long as requested
    assert bench("--endpoint", srv.base_url, "--levels", "2", "--trials", "1", "--no-warmup", "--workload",
                 "prose", "--output-tokens", "30", "--out", str(out2)) == 0
    (p2,) = rows(out2, "point")
    assert int(p2["short_streams"]) == 0 and int(p2["output_tokens"]) == 60


def test_server_dying_mid_sweep_leaves_valid_partial_results(fake, tmp_path, capsys):
    # requests per level with warm-up + 2 trials: c1 -> 3, c2 -> 6 (9 in all), c4 -> 12: request 16 kills it
    srv = fake(alpha=0.005, beta=0.0005, die_after_requests=15)
    out = tmp_path / "run"
    t0 = time.monotonic()
    rc = bench("--endpoint", srv.base_url, "--levels", "1,2,4,8", "--trials", "2", "--workload", "code",
               "--output-tokens", "30", "--out", str(out))
    assert time.monotonic() - t0 < 60
    err = capsys.readouterr().err
    assert rc == 3
    assert "stopped answering" in err and "connection refused" in err and "Partial results in" in err
    points = rows(out, "point")
    assert [int(p["concurrency"]) for p in points] == [1, 2]
    assert all(int(p["errors"]) == 0 and p["per_stream_median_tps"] for p in points)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["complete"] is False
    assert [p["concurrency"] for p in summary["curves"][0]["points"]] == [1, 2]
    assert "Partial results (failed)" in (out / "report.html").read_text()
    assert json.loads((out / "meta.json").read_text())["status"] == "failed"


def test_wrong_url_or_model_fails_within_seconds(fake, tmp_path, capsys):
    srv = fake()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cases = [
        (["--endpoint", f"http://127.0.0.1:{closed}"], ["cannot connect", "connection refused", str(closed)]),
        (["--endpoint", srv.base_url, "--model", "nope"],
         ["model 'nope' is not served here; served: fake-model"]),
        (["--endpoint", srv.base_url + "/not-openai"], ["returned 404", "not an OpenAI-compatible endpoint"]),
    ]
    for argv, expected in cases:
        t0 = time.monotonic()
        rc = bench(*argv, "--out", str(tmp_path / "x"))
        err = capsys.readouterr().err
        assert rc == 1, argv
        assert time.monotonic() - t0 < 5, argv
        for text in expected:
            assert text in err, (text, err)
        assert "Traceback" not in err


def test_silent_server_times_out_instead_of_hanging(fake, tmp_path, capsys):
    # a listener that accepts and never answers (preflight), and a server whose streams go silent
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        t0 = time.monotonic()
        rc = bench("--endpoint", f"http://127.0.0.1:{silent.getsockname()[1]}", "--connect-timeout", "1",
                   "--out", str(tmp_path / "x"))
        assert rc == 1 and time.monotonic() - t0 < 5
        assert "timed out" in capsys.readouterr().err
    finally:
        silent.close()
    srv = fake(alpha=0.005, beta=0.0005, stall_after_tokens=5)
    t0 = time.monotonic()
    rc = bench("--endpoint", srv.base_url, "--levels", "2", "--trials", "1", "--no-warmup",
               "--read-timeout", "1", "--output-tokens", "30", "--workload", "code", "--out", str(tmp_path / "y"))
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err
    assert rc == 3 and "every request of" in err and "timed out: no data for 1s" in err


def test_fleet_reports_per_endpoint_curves_and_summed_capacity(fake, tmp_path, capsys):
    # a busy machine only makes streams slower: every rate that must reach the floor does so with a
    # wide margin (spark-a at 8: +85%, spark-b at 4: +39%), spark-b's at 8 is below it
    a = fake(alpha=0.010, beta=0.001)   # per-stream 90.9, 83.3, 71.4, 55.6 at 1, 2, 4, 8
    b = fake(alpha=0.008, beta=0.004)   # 83.3, 62.5, 41.7, 25.0
    out = tmp_path / "fleet"
    rc = bench("--endpoint", a.base_url, "--endpoint", b.base_url, "--label", "spark-a", "--label", "spark-b",
               "--levels", "1,2,4,8", "--trials", "1", "--no-warmup", "--workload", "code",
               "--output-tokens", "20", "--floor", "30", "--out", str(out))
    assert rc == 0
    stdout = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    fleet = summary["fleet"]["code"]
    assert fleet["endpoints"]["spark-a"]["capacity"] == {"30": 8}
    assert fleet["endpoints"]["spark-b"]["capacity"] == {"30": 4}
    assert fleet["total"] == {"30": 12}
    assert "fleet, code: 12 streams at >= 30 tok/s" in stdout
    assert {r["label"] for r in rows(out, "point")} == {"spark-a", "spark-b"}
    for label, endpoint in (("spark-a", a.base_url), ("spark-b", b.base_url)):
        prof = json.loads((out / f"capacity_profile-{label}.json").read_text())
        assert prof["endpoint"] == endpoint and prof["label"] == label
    assert "Fleet capacity" in (out / "report.html").read_text()


def test_prefill_scenarios_measure_dip_and_cache(fake, tmp_path):
    """A 2000-token uncached prompt costs 2000 * 0.5 ms = 1 s of prefill, stalling every decode stream.

    The client times this on the wall clock, where a busy machine only makes steps later: its timing
    bounds are one-sided with slack (the exact stall and the cache's saving are asserted on the
    simulated clock: test_prefill_stall_is_exact_on_the_simulated_clock, test_prefix_cache_...)."""
    step = 0.010 + 0.004  # four streams
    srv = fake(alpha=0.010, beta=0.001, prefill_per_token=0.0005)
    out = tmp_path / "scn"
    rc = bench("--endpoint", srv.base_url, "--scenario", "prefill-interference", "--scenario", "prefix-reuse",
               "--api", "completions", "--long-prompt-tokens", "2000", "--scenario-streams", "4",
               "--baseline-seconds", "1", "--tail-seconds", "0.5", "--probe-interval", "0.2",
               "--reuse-repeats", "2", "--out", str(out))
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())["scenarios"]
    pi = s["prefill-interference"]
    assert pi["long_prompt"]["prompt_tokens"] == 2000
    # never faster than the engine; a stall of this process (the fake runs on one of its threads) slows it
    assert 0 < pi["baseline_tokens_per_second"] <= 1.1 / step
    assert pi["dip"]["detected"] and pi["dip"]["duration_s"] >= 0.75  # the 1 s stall, seen
    assert pi["dip"]["depth_ratio"] < 0.1
    assert pi["probe_ttft_during_prefill_s"]["count"] >= 2
    assert pi["probe_ttft_during_prefill_s"]["max"] > 0.6
    assert pi["baseline_probe_ttft_s"] < pi["probe_ttft_during_prefill_s"]["max"] - 0.5
    # the slowest running stream over the whole prefill got next to nothing (the 1 s stall)
    win = pi["prefill_window"]
    assert win["streams"] >= 1 and win["seconds"] >= 0.75
    assert win["slowest_tokens_per_second"] < 0.5 * pi["baseline_tokens_per_second"]
    pr = s["prefix-reuse"]
    assert pr["cold_ttft_s"] >= 0.75  # waits for its 1 s prefill
    assert pr["cold_ttft_s"] - pr["cached_ttft_s"] >= 0.75 and pr["speedup"] > 1  # the cache saved the prefill
    assert all(p["cached_tokens_reported"] == 2000 for p in pr["pairs"])
    assert (out / "prefill_interference.png").exists()
    html = (out / "report.html").read_text()
    assert "<h3>prefill-interference</h3>" in html and "<h3>prefix-reuse</h3>" in html
    assert html.count("data:image/png;base64,") == 1  # the interference plot


def test_ctrl_c_leaves_valid_partial_results(tmp_path):
    fake_proc = subprocess.Popen([sys.executable, "-m", "vllm_spark_plugin.testbed.fake_server", "--port", "0",
                                  "--alpha", "0.01", "--beta", "0.001"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = fake_proc.stdout.readline().strip().rsplit(" ", 1)[-1]
        out = tmp_path / "run"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen([sys.executable, "-m", "vllm_spark_plugin.cli", "bench", "--endpoint", url,
                                 "--levels", "1,2,4,8,16,32", "--trials", "2", "--workload", "code",
                                 "--output-tokens", "60", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                                # Ctrl-C's default action, even where this suite runs from a shell that
                                # ignores SIGINT for its background jobs (children inherit SIG_IGN)
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        # interrupt once the first level is measured, by the bench's own progress (not a wall-clock
        # poll, which a slow machine can let run to the end of the sweep)
        seen = []
        for line in proc.stderr:  # the progress lines
            seen.append(line)
            if "c=2 trial 1/2" in line:
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        stderr = "".join(seen) + stderr
        assert proc.returncode == 130, stderr
        assert "interrupted by the user" in stderr and "Partial results in" in stderr
        points = rows(out, "point")
        assert points and all(p["per_stream_median_tps"] for p in points)
        assert int(points[-1]["concurrency"]) < 32
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "interrupted" and len(summary["curves"][0]["points"]) == len(points)
        assert "Partial results (interrupted)" in (out / "report.html").read_text()
    finally:
        fake_proc.terminate()
        fake_proc.wait(10)


def test_progress_plain_lines_when_not_a_tty(fake, tmp_path, capsys):
    srv = fake(alpha=0.004, beta=0.0005)
    assert vllm_spark(["bench", "--endpoint", srv.base_url, "--levels", "1,2", "--trials", "1", "--workload",
                       "code", "--output-tokens", "10", "--out", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert lines[0].startswith("[1/4 ") and lines[-1].startswith("[4/4 100%]")
    assert "\r" not in err and "per-stream" in lines[-1]


# the overload scenario on the wall clock (its usage errors stay in tests/unit/test_bench_fake.py)
CAPACITY_AT_70 = 'vllm_spark_slo_capacity_streams{engine="0",floor="70",model_name="fake-model"} 1.0\n'


def test_overload_scenario_loads_a_multiple_of_the_live_capacity_and_judges_the_floor(fake, tmp_path):
    """The fake's steps take 5 + 5 ms per stream: one stream runs at 100 tok/s, three at 50.  It
    exports a live capacity of 1 at 70 tok/s; the scenario loads it at 3x that.  Where the server
    admits one at a time (max_batch=1, a guard's cap) the streams keep 100 tok/s and meet the
    floor (a busy machine can only slow them: a margin of 30%); where it admits all three, no stream
    can reach 70 tok/s (by construction, whatever the machine)."""
    results = {}
    for name, max_batch in (("capped", 1), ("uncapped", 4096)):
        srv = fake(alpha=0.005, beta=0.005, max_batch=max_batch, extra_metrics=CAPACITY_AT_70)
        out = tmp_path / name
        rc = bench("--endpoint", srv.base_url, "--scenario", "overload", "--slo-floor", "70", "--api", "completions",
                   "--output-tokens", "30", "--overload-requests", "9", "--out", str(out))
        assert rc == 0
        results[name] = r = json.loads((out / "summary.json").read_text())["scenarios"]["overload"]
        assert (r["capacity_streams"], r["capacity_source"], r["streams"]) == (1, "vllm_spark_slo_capacity_streams", 3)
        assert r["requests"] == r["completed"] == 9 and r["errors"] == 0
        assert r["rate_goodput_tokens_per_second"] == pytest.approx(
            r["output_tokens_per_second"] * r["rate_met_share"], rel=1e-6)
        assert "<h3>overload</h3>" in (out / "report.html").read_text()
    assert results["uncapped"]["rate_met_share"] == 0.0
    assert results["capped"]["rate_met_share"] >= 0.7
    assert results["capped"]["ttft_p50_s"] > results["uncapped"]["ttft_p50_s"]  # the wait moved into TTFT
