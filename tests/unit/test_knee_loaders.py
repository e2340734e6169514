"""Loaders for the three sweep formats, with fixture files written here to the documented layouts."""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest

from vllm_spark_plugin.knee.loaders import KneeInputError, load_points

SWEEP_HEADER = ["row_type", "label", "workload", "concurrency", "trial", "per_stream_median_tps",
                "aggregate_tps", "ttft_p50_s", "ttft_p99_s", "streams", "short_streams"]
SPARK_HEADER = ["run_id", "timestamp", "tier", "model", "label", "endpoint", "topology", "parallelism",
                "context", "batch", "spec_decode", "workload", "metric", "value", "unit", "notes",
                "mark", "size_tier"]


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


# ----------------------------------------------------------------------------- project sweep CSV

def test_sweep_csv_point_rows(tmp_path):
    rows = [
        ["trial", "marlin", "chat", 1, 0, 41.0, 40.0, 0.11, 0.2, 1, 0],
        ["trial", "marlin", "chat", 1, 1, 39.0, 41.0, 0.13, 0.3, 1, 0],
        ["point", "marlin", "chat", 1, "", 40.0, 40.715, 0.12, 0.25, 2, 0],
        ["point", "marlin", "chat", 64, "", 10.4, 557.471, 2.0, 3.1, 128, 0],
        ["point", "cutlass", "chat", 1, "", 40.0, 38.643, 0.12, "", 2, 0],
        ["point", "cutlass", "chat", 64, "", 10.4, 558.618, "", "", 128, 0],
    ]
    curves = load_points(write_csv(tmp_path / "sweep.csv", SWEEP_HEADER, rows))
    assert set(curves) == {"marlin", "cutlass"}
    m = curves["marlin"]
    assert [p.concurrency for p in m] == [1.0, 64.0]          # point rows only, sorted
    assert m[1].aggregate_tokens_per_second == 557.471
    assert m[1].per_stream_tokens_per_second == 10.4
    assert m[1].ttft_p50_seconds == 2.0 and m[1].ttft_p99_seconds == 3.1
    assert curves["cutlass"][1].ttft_p50_seconds is None       # empty cell -> unknown
    assert m[0].workload == "chat" and m[0].label == "marlin"


def test_sweep_csv_trial_rows_combined_by_median(tmp_path):
    trials = {1: [(41.0, 40.0, 0.11), (39.5, 41.0, 0.13), (40.2, 40.5, 0.10)],
              8: [(30.0, 236.0, 0.30), (31.0, 240.0, 0.31), (29.0, 233.0, 0.29)]}
    rows = [["trial", "tiny", "chat", c, i, r, a, t, t * 2, c, 0]
            for c, ts in trials.items() for i, (r, a, t) in enumerate(ts)]
    curves = load_points(write_csv(tmp_path / "s.csv", SWEEP_HEADER, rows))
    pts = curves["tiny"]
    for p in pts:
        ts = trials[int(p.concurrency)]
        assert p.per_stream_tokens_per_second == statistics.median(r for r, _, _ in ts)
        assert p.aggregate_tokens_per_second == statistics.median(a for _, a, _ in ts)
        assert p.ttft_p50_seconds == statistics.median(t for _, _, t in ts)
        assert p.trials == 3


def test_sweep_csv_two_workloads_become_two_curves(tmp_path):
    rows = [["point", "glm", w, c, "", 30.0 / c ** 0.3, 30.0 * c ** 0.7, 0.2, 0.4, c, 0]
            for w in ("code", "prose") for c in (1, 4, 16)]
    curves = load_points(write_csv(tmp_path / "s.csv", SWEEP_HEADER, rows))
    assert set(curves) == {"glm [code]", "glm [prose]"}
    assert all(len(v) == 3 for v in curves.values())


# ----------------------------------------------------------------------------- vllm bench serve JSON

def bench_result(c, tput, tpot, ttft, p99, model="Qwen/Qwen3.6-35B-A3B-NVFP4", label=None):
    return {"date": "20261129-110000", "endpoint_type": "vllm", "backend": "vllm", "label": label,
            "model_id": model, "tokenizer_id": model, "num_prompts": 4 * c, "request_rate": "inf",
            "burstiness": 1.0, "max_concurrency": c, "duration": 30.0, "completed": 4 * c,
            "total_input_tokens": 1000, "total_output_tokens": 9000, "request_throughput": 1.0,
            "output_throughput": tput, "total_token_throughput": tput * 1.1, "mean_ttft_ms": ttft,
            "median_ttft_ms": ttft, "p99_ttft_ms": p99, "mean_tpot_ms": tpot, "median_tpot_ms": tpot,
            "p99_tpot_ms": tpot * 1.5}


def test_vllm_bench_json_single_file(tmp_path):
    path = tmp_path / "vllm-infqps-concurrency1-Qwen.json"
    path.write_text(json.dumps(bench_result(1, 40.7, 25.0, 120.0, 180.0)))
    curves = load_points(path)
    [(label, [p])] = curves.items()
    assert label == "Qwen/Qwen3.6-35B-A3B-NVFP4"
    assert p.concurrency == 1
    assert p.per_stream_tokens_per_second == pytest.approx(1000 / 25.0)
    assert p.aggregate_tokens_per_second == 40.7
    assert p.ttft_p50_seconds == pytest.approx(0.120) and p.ttft_p99_seconds == pytest.approx(0.180)


def test_vllm_bench_json_directory_several_files_and_repeats(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    for c, tput, tpot in ((1, 40.7, 25.0), (8, 250.0, 32.0), (64, 557.0, 96.0)):
        (d / f"r-{c}.json").write_text(json.dumps(bench_result(c, tput, tpot, 100.0 * c, 150.0 * c)))
    # a repeat at 8 streams: trials of one point, combined by the median
    (d / "r-8b.json").write_text(json.dumps(bench_result(8, 260.0, 30.0, 800.0, 1200.0)))
    (d / "r-8c.json").write_text(json.dumps(bench_result(8, 255.0, 31.0, 790.0, 1100.0)))
    (d / "r-1.pytorch.json").write_text(json.dumps([{"benchmark": {}, "metric": {}}]))  # vLLM side file
    (d / "notes.txt").write_text("ignored")
    curves = load_points(d)
    [(label, pts)] = curves.items()
    assert [p.concurrency for p in pts] == [1, 8, 64]
    p8 = pts[1]
    assert p8.trials == 3
    assert p8.aggregate_tokens_per_second == 255.0
    assert p8.per_stream_tokens_per_second == pytest.approx(1000 / 31.0)
    # several explicit files give the same result as the directory
    files = sorted(str(f) for f in d.glob("r-*.json") if not f.name.endswith(".pytorch.json"))
    assert load_points(files)[label][1].aggregate_tokens_per_second == 255.0


def test_vllm_bench_append_result_jsonl_and_labels(tmp_path):
    path = tmp_path / "appended.json"
    lines = [json.dumps(bench_result(c, 40.0 * c ** 0.7, 25.0 * c ** 0.3, 100.0, 200.0, label=lab))
             for lab in ("marlin", "cutlass") for c in (1, 4, 16)]
    path.write_text("\n".join(lines) + "\n")
    curves = load_points(path)
    assert set(curves) == {"Qwen/Qwen3.6-35B-A3B-NVFP4/marlin", "Qwen/Qwen3.6-35B-A3B-NVFP4/cutlass"}
    assert all(len(v) == 3 for v in curves.values())


# ----------------------------------------------------------------------------- spark-bench long CSV

def spark_rows(run_id, model, label, batch, agg, per, t50, t99, topology="single"):
    common = [run_id, "2026-06-24T21:44:40", "perf", model, label, "http://spark:8000/v1", topology,
              "tp1", "", batch, "none", "concurrency"]
    return [common + [m, v, u, "", "new", "Medium"] for m, v, u in
            (("agg_decode_tps", agg, "tok/s"), ("per_stream_tps", per, "tok/s"),
             ("ttft_p50_ms", t50, "ms"), ("ttft_p99_ms", t99, "ms"),
             ("e2e_tps", agg * 0.9, "tok/s"))]


def test_spark_bench_long_csv(tmp_path):
    rows = [["eval-1", "2026-06-24", "eval", "z-ai/glm-5.2", "GLM", "https://x", "unknown", "1", "", "",
             "na", "overall", "truescore", 77.1, "score0-100", "thinking=auto, quoted", "old", "Large"]]
    for b, agg, per, t50 in ((1, 40.0, 40.0, 120), (8, 230.0, 29.0, 300), (16, 330.0, 21.0, 500)):
        rows += spark_rows("run-a", "qwen3.6-35b-a3b", "vllm-nvfp4", b, agg, per, t50, t50 * 2)
    rows += spark_rows("run-b", "qwen3.6-35b-a3b", "vllm-nvfp4", 16, 340.0, 21.4, 520, 990)
    rows += spark_rows("run-b", "qwen3.6-35b-a3b", "vllm-nvfp4", 4, 135.0, 34.0, 200, 400)
    rows += spark_rows("run-c", "qwen3.6-35b-a3b", "vllm-fp8", 1, 35.0, 35.0, 110, 200)
    rows += spark_rows("run-c", "qwen3.6-35b-a3b", "vllm-fp8", 8, 200.0, 25.0, 280, 600)
    curves = load_points(write_csv(tmp_path / "spark_bench.csv", SPARK_HEADER, rows))
    assert set(curves) == {"qwen3.6-35b-a3b/vllm-nvfp4", "qwen3.6-35b-a3b/vllm-fp8"}
    nv = curves["qwen3.6-35b-a3b/vllm-nvfp4"]
    assert [p.concurrency for p in nv] == [1, 4, 8, 16]
    p16 = nv[3]
    assert p16.aggregate_tokens_per_second == statistics.median([330.0, 340.0])
    assert p16.per_stream_tokens_per_second == statistics.median([21.0, 21.4])
    assert p16.ttft_p50_seconds == pytest.approx(statistics.median([500, 520]) / 1000)
    assert p16.ttft_p99_seconds == pytest.approx(statistics.median([1000, 990]) / 1000)
    assert p16.trials == 2


def test_spark_bench_curves_split_by_differing_configuration(tmp_path):
    rows = []
    for topo, scale in (("single", 1.0), ("ring4", 2.0)):
        for b in (1, 4, 16):
            rows += spark_rows("r-" + topo, "deepseek", "vllm", b, 20.0 * b ** 0.6 * scale, 20.0 / b ** 0.4, 200, 400, topo)
    curves = load_points(write_csv(tmp_path / "sb.csv", SPARK_HEADER, rows))
    assert set(curves) == {"deepseek/vllm [topology=single]", "deepseek/vllm [topology=ring4]"}


# ----------------------------------------------------------------------------- garbage

@pytest.mark.parametrize("name, content, message", [
    ("empty.csv", "", "empty file"),
    ("blank.json", "   \n", "empty file"),
    ("other.csv", "a,b,c\n1,2,3\n", "unrecognised CSV columns"),
    ("one-col.csv", "just text\nmore text\n", "neither JSON nor a CSV"),
    ("not-bench.json", json.dumps({"hello": 1}), "not a `vllm bench serve` result"),
    ("rate-run.json", json.dumps({**bench_result(1, 1, 1, 1, 1), "max_concurrency": None}), "max_concurrency is None"),
    ("bad.json", "{not json", "not valid JSON"),
    ("list.json", json.dumps([1, 2]), "expected a JSON object"),
    ("bad-number.csv", ",".join(SWEEP_HEADER) + "\npoint,x,chat,4,,fast,10,0.1,0.2,4,0\n", "line 2: per_stream_median_tps = 'fast' is not a number"),
    ("no-concurrency.csv", ",".join(SWEEP_HEADER) + "\npoint,x,chat,,,10,10,0.1,0.2,4,0\n", "line 2: a point row without a concurrency"),
    ("no-rows.csv", ",".join(SWEEP_HEADER) + "\nsummary,x,chat,4,,10,10,0.1,0.2,4,0\n", "no rows with row_type"),
    ("spark-empty.csv", ",".join(SPARK_HEADER) + "\n", "without rows of workload 'concurrency'"),
])
def test_garbage_is_rejected_naming_file_and_problem(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(KneeInputError) as exc:
        load_points(path)
    assert str(path) in str(exc.value)
    assert message in str(exc.value)


def test_binary_missing_and_empty_directory_are_rejected(tmp_path):
    binary = tmp_path / "blob.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81garbage\x00")
    with pytest.raises(KneeInputError, match="not a text file"):
        load_points(binary)
    with pytest.raises(KneeInputError, match="no such file"):
        load_points(tmp_path / "missing.csv")
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    with pytest.raises(KneeInputError, match="no .json, .jsonl or .csv"):
        load_points(empty)


def test_reads_the_csv_that_the_sweep_benchmark_writes(tmp_path):
    """Round trip through the benchmark's own writer (bench/results.py), not a hand-made layout."""
    from vllm_spark_plugin.bench.results import CsvWriter, CurveKey, Row
    from vllm_spark_plugin.bench.stats import Metrics

    key = CurveKey(label="tiny", workload="chat", endpoint="http://127.0.0.1:8000", model="tiny-moe")

    def metrics(r, a, t50):
        return Metrics(requests=8, completed=8, errors=0, short_streams=0, per_stream_median_tps=r,
                       per_stream_min_tps=r * 0.9, per_stream_p10_tps=r * 0.95, aggregate_tps=a,
                       output_tps=a * 0.9, ttft_p50_s=t50, ttft_p90_s=t50 * 1.5, ttft_p99_s=t50 * 2,
                       output_tokens=512, prompt_tokens=256, duration_s=3.0, bunched_streams=0)

    path = tmp_path / "sweep.csv"
    writer = CsvWriter(path)
    common = dict(date="2026-11-29", mode="closed", api="completions", requested_output_tokens=64,
                  temperature=0.0, ignore_eos=True)
    for c, r, a, t50 in ((1, 224.0, 220.0, 0.05), (8, 118.0, 900.0, 0.12), (32, 53.0, 1700.0, 0.4)):
        for trial in (1, 2):
            writer.write(Row("trial", key, c, trial, metrics(r + trial, a + trial, t50), **common))
        writer.write(Row("point", key, c, 2, metrics(r, a, t50), **common))
    writer.close()
    [(label, pts)] = load_points(path).items()
    assert label == "tiny"
    assert [(p.concurrency, p.per_stream_tokens_per_second, p.aggregate_tokens_per_second, p.trials)
            for p in pts] == [(1, 224.0, 220.0, 2), (8, 118.0, 900.0, 2), (32, 53.0, 1700.0, 2)]
    assert pts[2].ttft_p99_seconds == pytest.approx(0.8)


def test_bench_output_folder_reads_its_sweep_csv(tmp_path):
    """`vllm-spark knee runs/bench-X/` uses the folder's sweep.csv, not its other JSON files."""
    test_reads_the_csv_that_the_sweep_benchmark_writes(tmp_path)
    (tmp_path / "summary.json").write_text('{"not": "a vllm bench result"}')
    (tmp_path / "capacity_profile.json").write_text('{"knee": 3}')
    [(label, pts)] = load_points(tmp_path).items()
    assert label == "tiny" and len(pts) == 3


# ----------------------------------------------------------------------------- AIPerf and GuideLLM exports
# Real files: written by aiperf 0.13.0 and guidellm 0.8.1 against the CPU test server (tiny model,
# concurrency 1, 2, 4, 8, 16 requests each; tests/fixtures/sweeps/README.md has the commands).  Their
# timings are distorted on 2 shared cores: what is checked is the reading and the fit, not the figures.

SWEEPS = Path(__file__).resolve().parent.parent / "fixtures" / "sweeps"
AIPERF_DIR, GUIDELLM_JSON = SWEEPS / "aiperf", SWEEPS / "guidellm" / "benchmarks.json"


def aiperf_runs():
    return sorted(AIPERF_DIR.glob("concurrency_*/profile_export_aiperf.json"))


def test_aiperf_artifact_folder_reads_each_run(tmp_path):
    runs = {json.loads(f.read_text())["input_config"]["phases"][0]["concurrency"]: json.loads(f.read_text())
            for f in aiperf_runs()}
    [(label, pts)] = load_points(AIPERF_DIR).items()
    assert label == "tiny-qwen3-moe"
    assert [p.concurrency for p in pts] == sorted(runs) == [1, 2, 4, 8]
    for p in pts:
        run = runs[int(p.concurrency)]
        assert p.extra["requests"] == run["completed_request_count"]["avg"] == 16
        assert p.per_stream_tokens_per_second == run["output_token_throughput_per_user"]["p50"]
        assert p.aggregate_tokens_per_second == run["output_token_throughput"]["avg"]
        assert p.ttft_p50_seconds == pytest.approx(run["time_to_first_token"]["p50"] / 1000)
        assert p.ttft_p99_seconds == pytest.approx(run["time_to_first_token"]["p99"] / 1000)


def test_aiperf_sweep_aggregate_gives_the_same_points():
    [(label, pts)] = load_points(AIPERF_DIR / "sweep_aggregate" / "profile_export_aiperf_sweep.json").items()
    [(_, runs)] = load_points(AIPERF_DIR).items()
    assert label == "aiperf"  # the aggregate does not name the model
    assert [(p.concurrency, p.per_stream_tokens_per_second, p.aggregate_tokens_per_second, p.ttft_p50_seconds)
            for p in pts] == [(p.concurrency, p.per_stream_tokens_per_second, p.aggregate_tokens_per_second,
                               p.ttft_p50_seconds) for p in runs]


def test_an_aiperf_level_read_in_one_burst_has_no_per_stream_rate_and_keeps_the_rest(tmp_path):
    """A client starved on 2 shared cores read every stream of a level in one burst (a clean-clone run:
    concurrency 2, inter-token latencies all 0, per-user throughput null): that level has no rate, as
    the file has none, and keeps its aggregate and TTFT."""
    sweep = json.loads((AIPERF_DIR / "sweep_aggregate" / "profile_export_aiperf_sweep.json").read_text())
    combo = sweep["per_combination_metrics"][1]
    m = combo.get("metrics", combo)
    m["output_token_throughput_per_user"] = None
    m["inter_token_latency"] = {k: (0.0 if isinstance(v, float) else v) for k, v in m["inter_token_latency"].items()}
    path = tmp_path / "profile_export_aiperf_sweep.json"
    path.write_text(json.dumps(sweep))
    [(_, pts)] = load_points(path).items()
    [(_, whole)] = load_points(AIPERF_DIR).items()
    assert [p.per_stream_tokens_per_second is None for p in pts] == [i == 1 for i in range(len(pts))]
    assert [(p.aggregate_tokens_per_second, p.ttft_p50_seconds) for p in pts] == \
        [(p.aggregate_tokens_per_second, p.ttft_p50_seconds) for p in whole]


def test_guidellm_benchmarks_json_by_the_seed_definitions():
    """Per-stream rate and aggregate from each request's first and last token, the way bench measures."""
    from vllm_spark_plugin.definitions import StreamTiming, aggregate_throughput

    report = json.loads(GUIDELLM_JSON.read_text())
    [(label, pts)] = load_points(GUIDELLM_JSON.parent).items()
    assert label == report["config"]["spec"]["backend"]["model"] == "tiny-qwen3-moe"
    assert [p.concurrency for p in pts] == [b["config"]["strategy"]["streams"] for b in report["benchmarks"]]
    for p, bench in zip(pts, report["benchmarks"]):
        reqs = bench["requests"]["successful"]
        assert p.extra["requests"] == len(reqs) == bench["metrics"]["request_totals"]["successful"] == 16
        # the tool's own per-request inter-token latency is (last - first) / (tokens - 1): the same rate
        assert p.per_stream_tokens_per_second == pytest.approx(
            statistics.median(1000 / r["inter_token_latency_ms"] for r in reqs), rel=1e-6)
        t = [r["info"]["timings"] for r in reqs]
        assert p.aggregate_tokens_per_second == pytest.approx(aggregate_throughput(
            StreamTiming(r["output_tokens"], x["request_start"], x["first_token_iteration"], x["last_token_iteration"])
            for r, x in zip(reqs, t)))
        assert p.ttft_p50_seconds == pytest.approx(bench["metrics"]["time_to_first_token_ms"]["successful"]["median"] / 1000)


@pytest.mark.parametrize("source, verdict", [("aiperf", "no knee in the measured range"), ("guidellm", "ok")])
def test_the_fit_runs_on_each_real_export(source, verdict, capsys):
    """`vllm-spark knee FOLDER --json` on each export: the verdict its (distorted) points give; where
    it is ok, the knee with its interval and the capacity at 20 tok/s."""
    import argparse

    from vllm_spark_plugin.knee import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    folder = AIPERF_DIR if source == "aiperf" else GUIDELLM_JSON.parent
    assert cli.run(parser.parse_args([str(folder), "--json", "--floor", "20", "--bootstrap", "200"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "tiny-qwen3-moe" and out["n"] == 8  # 4 points, per-stream and aggregate each
    assert out["verdict"] == verdict and "20" in out["capacity"]
    if verdict == "ok":
        lo, hi = out["ci"]["knee"]
        assert lo <= out["knee"] <= hi and out["capacity"]["20"] >= 1


def test_tool_exports_that_give_no_curve_are_refused(tmp_path):
    report = json.loads(GUIDELLM_JSON.read_text())
    for b in report["benchmarks"]:
        b["config"]["strategy"] = {"type_": "constant", "rate": 2.0}
    rate_only = tmp_path / "benchmarks.json"
    rate_only.write_text(json.dumps(report))
    with pytest.raises(KneeInputError, match="no concurrent or synchronous GuideLLM benchmark .found: constant"):
        load_points(rate_only)

    run = json.loads(aiperf_runs()[0].read_text())
    run["input_config"]["phases"][0]["concurrency"] = None
    rate_run = tmp_path / "rate" / "profile_export_aiperf.json"
    rate_run.parent.mkdir()
    rate_run.write_text(json.dumps(run))
    with pytest.raises(KneeInputError, match="without a fixed concurrency"):
        load_points(rate_run.parent)

    cases = {"profile_export_aiperf.csv": "Metric,avg,min,max\nRequest Latency (ms),1,1,1\n",
             "profile_export_aiperf_sweep.csv": "concurrency,request_latency_mean\n1,2.0\n",
             "benchmarks.csv": "Run Info,Run Info,Benchmark\nModel,Task,Strategy\n",
             "benchmarks.yaml": "benchmarks: []\n",
             "profile_export_aiperf_aggregate.json": json.dumps({"aiperf_version": "0.13.0", "metadata": {},
                                                                  "metrics": {}})}
    expected = {"profile_export_aiperf.csv": "an AIPerf CSV", "profile_export_aiperf_sweep.csv": "an AIPerf CSV",
                "benchmarks.csv": "a GuideLLM CSV", "benchmarks.yaml": "YAML is not read",
                "profile_export_aiperf_aggregate.json": "an AIPerf confidence aggregate"}
    for name, content in cases.items():
        path = tmp_path / name
        path.write_text(content)
        with pytest.raises(KneeInputError) as exc:
            load_points(path)
        assert str(path) in str(exc.value) and expected[name] in str(exc.value)
