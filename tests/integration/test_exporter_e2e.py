"""End to end: a real CPU `vllm serve` with the plugin, real streaming clients, the real /metrics."""
from __future__ import annotations

import re
import threading
import time
import urllib.request

import pytest

from support.load import run_streams, run_streams_with_arrivals
from support.scrape import buckets, delta_buckets, scrape, value

pytestmark = pytest.mark.server

P = "vllm_spark_"


def _wait_idle(server, timeout=60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = scrape(server.metrics_url)
        if value(s, P + "running_requests") == 0 and value(s, P + "waiting_requests") == 0:
            return s
        time.sleep(0.2)
    raise AssertionError("server did not go idle")


class KvWatcher(threading.Thread):
    """Polls /metrics during a load to see KV blocks in use while requests run, and the most
    requests vLLM's own gauge showed running.

    It reads two lines with regexes instead of parsing the page: a full parse holds the GIL long
    enough to delay the streaming client in the same process and distort its token timings.
    """

    LINE = re.compile(rb"^vllm_spark_kv_blocks_used\{[^}]*\} ([0-9.e+]+)$", re.M)
    RUNNING = re.compile(rb"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", re.M)

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.max_used, self.max_running, self.stop = url, 0.0, 0.0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    page = r.read()
                for m in self.LINE.finditer(page):
                    self.max_used = max(self.max_used, float(m.group(1)))
                for m in self.RUNNING.finditer(page):
                    self.max_running = max(self.max_running, float(m.group(1)))
            except OSError:
                pass
            time.sleep(0.5)  # each scrape renders the whole registry in the API server: not 10 a second


@pytest.fixture(scope="module")
def load_runs(vllm_server):
    """Concurrency 1, 4 and 16, one after the other; metric deltas of each run."""
    return {c: _load_run(vllm_server, c, WAVES[c]) for c in (1, 4, 16)}


WAVES = {1: 7, 4: 2, 16: 1}  # a few waves where one wave has few streams


def _load_run(server, c: int, waves: int, tag: str = "") -> dict:
    before = _wait_idle(server)
    watcher = KvWatcher(server.metrics_url)
    watcher.start()
    streams, arrivals = [], []
    for w in range(waves):
        got = run_streams_with_arrivals(server.base_url, server.model, c, max_tokens=1024,
                                        prompt_prefix=f"{tag}c{c}w{w}")
        streams += [t for t, _ in got]
        arrivals += [a for _, a in got]
    watcher.stop.set()
    watcher.join()
    after = _wait_idle(server)
    return dict(before=before, after=after, streams=streams, arrivals=arrivals, kv_max=watcher.max_used,
                running_max=watcher.max_running)


@pytest.mark.parametrize("c", [1, 4, 16])
def test_batch_size_histogram_reaches_concurrency_and_not_above(load_runs, c):
    """No step above the concurrency; and the histogram reaches as high as vLLM's own running gauge
    went during the load (sampled every 0.5 s, so a lower bound of the largest batch).  Clients that
    start c streams together usually make a batch of c, but not by construction: under a CPU hog
    one of four requests reached the engine after the other three had run 1,000 steps, and vLLM's
    gauge and the histogram both stopped at 3."""
    r = load_runs[c]
    d = delta_buckets(buckets(r["after"], P + "step_batch_size"), buckets(r["before"], P + "step_batch_size"))
    total = d[float("inf")]
    assert total > 0
    assert d[float(c)] == total, f"steps with more than {c} requests: {d}"
    assert 1 <= r["running_max"] <= c, r["running_max"]
    reached = int(r["running_max"])
    below = max((le for le in d if le < reached), default=0.0)  # the bucket under `reached`
    assert total - d.get(below, 0.0) > 0, f"vLLM showed {reached} running, the histogram no step that large: {d}"
    print(f"\nc={c}: vLLM's gauge reached {reached} running; batch histogram {d}")


@pytest.mark.parametrize("c", [1, 4, 16])
def test_ttft_and_stream_rate_counts(load_runs, c):
    r = load_runs[c]
    ttft = value(r["after"], P + "ttft_seconds_count") - value(r["before"], P + "ttft_seconds_count")
    rate = (value(r["after"], P + "stream_decode_tokens_per_second_count")
            - value(r["before"], P + "stream_decode_tokens_per_second_count"))
    finished = value(r["after"], P + "requests_finished_total") - value(r["before"], P + "requests_finished_total")
    assert ttft == len(r["streams"])
    assert finished == len(r["streams"])
    assert rate == finished


def test_generation_tokens_equal_usage(load_runs):
    for c, r in load_runs.items():
        gen = value(r["after"], P + "generation_tokens_total") - value(r["before"], P + "generation_tokens_total")
        assert gen == sum(s.output_tokens for s in r["streams"]), c


def test_kv_blocks(load_runs, vllm_server):
    r = load_runs[16]
    # any run's watcher will do: a poll every 0.5 s can miss a short wave on a starved 2-core box
    assert max(run["kv_max"] for run in load_runs.values()) > 0, "no KV block in use seen under load"
    assert value(r["after"], P + "kv_blocks_used") == 0, "KV blocks still in use when idle"
    total = value(r["after"], P + "kv_blocks_total")
    info = [dict(lab) for (n, lab) in r["after"] if n == "vllm:cache_config_info"]
    assert info, "vLLM's cache_config_info is missing"
    assert total == float(info[0]["num_gpu_blocks"])


def test_step_duration_and_tokens_recorded(load_runs):
    r = load_runs[16]
    steps = value(r["after"], P + "step_duration_seconds_count") - value(r["before"], P + "step_duration_seconds_count")
    batches = value(r["after"], P + "step_batch_size_count") - value(r["before"], P + "step_batch_size_count")
    assert steps == batches > 0
    decode = (value(r["after"], P + "step_tokens_sum", phase="decode")
              - value(r["before"], P + "step_tokens_sum", phase="decode"))
    prefill = (value(r["after"], P + "step_tokens_sum", phase="prefill")
               - value(r["before"], P + "step_tokens_sum", phase="prefill"))
    # every generated token but each request's first (sampled after its prefill) comes from a decode step
    gen = sum(s.output_tokens for s in r["streams"])
    assert decode == gen - len(r["streams"])
    assert prefill > 0
    dur = value(r["after"], P + "step_duration_seconds_sum") - value(r["before"], P + "step_duration_seconds_sum")
    span = max(s.last_token for s in r["streams"]) - min(s.start for s in r["streams"])
    assert 0 < dur <= span * 1.05, (dur, span)


def test_plugin_loaded_in_api_server_and_engine_core(load_runs, vllm_server):
    log = vllm_server.log_path.read_text(errors="replace")
    assert re.search(r"APIServer pid=\d+.*vllm-spark-plugin: stat logger active in the API server", log)
    assert re.search(r"EngineCore pid=\d+.*vllm-spark-plugin .* loaded in process EngineCore.*role engine_core", log)
    assert re.search(r"EngineCore pid=\d+.*vllm-spark-plugin: scheduler hook active in this engine core", log)


def test_info_and_no_errors(load_runs):
    after = load_runs[16]["after"]
    info = [dict(lab) for (n, lab), v in after.items() if n == P + "info" and v == 1]
    import vllm
    assert info and info[0]["vllm_version"] == vllm.__version__ and info[0]["device"] == "cpu"
    assert info[0]["features_off"] == "none"
    errors = {dict(lab).get("where"): v for (n, lab), v in after.items() if n == P + "plugin_errors_total"}
    # a late answer of the test bed's OTLP receiver is a failed export, counted by design (the bridge's
    # delivery has its own test below): on a starved 2-core box one can happen
    errors.pop("otel_export", None)
    assert all(v == 0 for v in errors.values()), errors


HANG_UP_REACH_SECONDS = 1.0  # a hang-up's way to vLLM's abort: the connection's close, one await


def test_aborted_requests_do_not_break_serving(vllm_server):
    """Clients that hang up mid-stream reach vLLM as aborts through the plugin's delivery wrapper
    (hooks/delivery.py), and clients that hang up before their first token (zero-token requests) do not
    break serving either.

    Judged one request at a time on the server's own record: a hung-up request vLLM counts as finished
    must have run to its end (vLLM's e2e latency) before its hang-up could reach vLLM (the client's
    time to its first chunk, plus HANG_UP_REACH_SECONDS).  On two loaded cores the first token can reach
    the client seconds late, after the engine has decoded all 1,900 tokens: nothing can abort that
    request (docs/verified.md).  A wrapper that lost the cancellation lets every request run its
    1,900 tokens, ten seconds here, long after its hang-up."""
    import asyncio

    import aiohttp

    async def hang_up(n, max_tokens, after_first_token):
        waits = []
        async with aiohttp.ClientSession() as session:
            for i in range(n):
                body = {"model": vllm_server.model, "prompt": f"abort {i}", "max_tokens": max_tokens,
                        "stream": True, "ignore_eos": True}
                sent = time.monotonic()
                async with session.post(vllm_server.base_url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    if after_first_token:
                        assert (await resp.content.readline()).startswith(b"data:")
                waits.append(time.monotonic() - sent)
        return waits
    gen, fin, e2e = P + "generation_tokens_total", P + "requests_finished_total", "vllm:e2e_request_latency_seconds_sum"
    s = first = _wait_idle(vllm_server)
    # Hung up after the first token: the request is in the engine, so a hang-up that reaches vLLM before
    # the request's end aborts it.  (Before the first token a hang-up can land while vLLM is still adding
    # the request, after it reached the engine core: AsyncLLM.generate has no request to abort yet and it
    # runs on; that window is vLLM's, so aborts are judged here, past it.)
    aborted, ran_out = 0, []
    for i in range(4):
        (wait,) = asyncio.run(hang_up(1, 1900, True))
        time.sleep(0.5)  # past the step that would show it running, had the abort not reached the engine
        before, s = s, _wait_idle(vllm_server)
        if value(s, fin) - value(before, fin) == 0:
            aborted += 1
            continue
        took = value(s, e2e) - value(before, e2e)
        ran_out.append(f"request {i}: ran out in {took:.1f} s, first chunk read after {wait:.1f} s")
        assert took <= wait + HANG_UP_REACH_SECONDS, ran_out[-1] + ": its hang-up did not abort it"
    print(f"\n4 hung-up requests: {aborted} aborted, {value(s, gen) - value(first, gen):.0f} tokens generated; "
          f"ran out before their hang-up: {ran_out or 'none'}")
    assert aborted >= 1
    asyncio.run(hang_up(4, 64, False))  # zero-token requests through the delivery wrapper
    streams = run_streams(vllm_server.base_url, vllm_server.model, 2, max_tokens=16, prompt_prefix="after-abort")
    assert all(s.output_tokens == 16 for s in streams)
    s = _wait_idle(vllm_server)
    assert value(s, P + "plugin_errors_total") == value(s, P + "plugin_errors_total", where="otel_export")


def test_otel_bridge_exports_live_series(load_runs, vllm_server, otlp_receiver):
    """The server's bridge sends the same series over OTLP as /metrics serves (compared while idle)."""
    _wait_idle(vllm_server)
    expected = value(scrape(vllm_server.metrics_url), P + "generation_tokens_total")
    exported, m = None, {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and exported != expected:
        time.sleep(0.5)
        m = otlp_receiver.latest_metrics()
        gen = m.get("vllm_spark_generation_tokens_total")
        if gen is not None:
            exported = sum(p.as_double for p in gen.sum.data_points)
    assert exported == expected >= value(load_runs[16]["after"], P + "generation_tokens_total"), sorted(m)
    assert "vllm_spark_step_duration_seconds" in m and "vllm_spark_ttft_seconds" in m


def test_live_knee_has_a_verdict_and_a_finite_fit(load_runs, vllm_server):
    """After steps at more than one batch size the refit publishes one verdict, and a finite knee with it.

    The fit reads the engine's last 4,096 steps (SPARK_PLUGIN_KNEE_WINDOW), and the tests before this one
    share the server: lone requests of up to 1,900 tokens (the abort test's, when they run out before
    their hang-ups) can fill the window with steps at a batch of 1, and a clean-clone run on a fast day
    read "no spread" here once.  So the test runs its own four streams first (steps at a batch of up to
    4 beside those at 1), then waits for the refit after them."""
    run_streams(vllm_server.base_url, vllm_server.model, 4, max_tokens=256, prompt_prefix="knee")
    _wait_idle(vllm_server)
    deadline = time.monotonic() + 30  # a refit every SPARK_PLUGIN_KNEE_REFIT_SECONDS (10 s)
    while True:
        s = scrape(vllm_server.metrics_url)
        verdicts = [dict(lab)["verdict"] for (n, lab), v in s.items() if n == P + "knee_verdict" and v == 1]
        fitted = verdicts and verdicts[0] in ("ok", "no knee in the measured range")
        if (fitted and value(s, P + "knee_fit_samples") > 0) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(verdicts) == 1, verdicts
    assert value(s, P + "knee_fit_samples") > 0
    assert verdicts[0] in ("ok", "no knee in the measured range"), verdicts
    if verdicts[0] == "ok":
        knee = value(s, P + "knee_batch_size")
        assert 0 < knee < float("inf")
