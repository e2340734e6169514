"""Unit tests of the benchmark's pure parts: the seed definitions applied per trial and per point,
output-length validation, metadata parsing, prompts, the prefill-dip analysis, option checking."""
from __future__ import annotations

import argparse

import pytest

from vllm_spark_plugin.bench import cli as bench_cli
from vllm_spark_plugin.bench.client import normalize_endpoint
from vllm_spark_plugin.bench.scenarios import find_dip, rate_timeline
from vllm_spark_plugin.bench.server_info import ServerInfo, parse_info_metric
from vllm_spark_plugin.bench.stats import summarize
from vllm_spark_plugin.bench.workloads import PromptFactory, make_workload, prompt_sets
from vllm_spark_plugin.definitions import StreamTiming


def stream(n, start, first, last, requested=None, error=None, prompt=10):
    return StreamTiming(output_tokens=n, start=start, first_token=first, last_token=last,
                        prompt_tokens=prompt, requested_tokens=requested if requested is not None else n,
                        error=error)


def test_trial_metrics_follow_the_seed_definitions():
    # 3 streams: rates (n-1)/(last-first) = 99/1 = 99, 99/2 = 49.5, 99/4 = 24.75
    s = [stream(100, 0.0, 0.1, 1.1), stream(100, 0.0, 0.2, 2.2), stream(100, 0.0, 0.3, 4.3)]
    m = summarize([s], [5.0])
    assert m.per_stream_median_tps == pytest.approx(49.5)
    assert m.per_stream_min_tps == pytest.approx(24.75)
    # aggregate: sum(n-1) / (latest last - earliest first) = 297 / (4.3 - 0.1)
    assert m.aggregate_tps == pytest.approx(297 / 4.2)
    assert m.aggregate_tps != pytest.approx(3 * m.per_stream_median_tps)
    assert m.ttft_p50_s == pytest.approx(0.2)
    assert m.output_tps == pytest.approx(300 / 5.0)
    assert (m.requests, m.completed, m.errors, m.short_streams) == (3, 3, 0, 0)


def test_point_takes_median_of_trial_medians_and_pools_min_p10_ttft():
    t1 = [stream(11, 0, 0.1, 1.1), stream(11, 0, 0.1, 2.1), stream(11, 0, 0.1, 0.6)]  # 10, 5, 20 -> median 10
    t2 = [stream(11, 0, 0.2, 0.7), stream(11, 0, 0.2, 0.45), stream(11, 0, 0.2, 0.533333)]  # 20, 40, 30 -> 30
    t3 = [stream(11, 0, 0.3, 1.3)]  # 10
    m = summarize([t1, t2, t3], [1.0, 1.0, 1.0])
    assert m.per_stream_median_tps == pytest.approx(10.0)  # median(10, 30, 10), not the pooled median
    assert m.per_stream_min_tps == pytest.approx(5.0)
    pooled = sorted([10, 5, 20, 20, 40, 30.0000187, 10])
    assert m.per_stream_p10_tps == pytest.approx(pooled[0] + 0.6 * (pooled[1] - pooled[0]), rel=1e-4)
    assert m.requests == 7 and m.duration_s == pytest.approx(3.0)


def test_short_streams_are_counted_and_left_out_of_rates_unless_asked():
    full = [stream(101, 0, 0.1, 1.1, requested=101)]  # 100 tok/s
    short = stream(11, 0, 0.1, 0.11, requested=101)  # 1000 tok/s, ended early
    m = summarize([full + [short]], [1.2])
    assert m.short_streams == 1
    assert m.per_stream_median_tps == pytest.approx(100.0)
    assert m.completed == 2  # a short stream is a completed request
    assert m.output_tokens == 112  # ... and its tokens are work the server did
    m2 = summarize([full + [short]], [1.2], include_short=True)
    assert m2.per_stream_median_tps == pytest.approx(550.0)


def test_bunched_streams_counted_and_left_out_of_rates():
    from vllm_spark_plugin.bench.client import StreamResult
    steady = StreamResult(stream(101, 0, 0.1, 1.1), arrivals=100)  # 100 tok/s
    burst = StreamResult(stream(101, 0, 0.5, 0.5001), arrivals=1)  # 1,000,000 tok/s: no timing in it
    m = summarize([[steady, burst]], [1.2])
    assert m.bunched_streams == 1 and m.completed == 2 and m.output_tokens == 202
    assert m.per_stream_median_tps == pytest.approx(100.0) and m.per_stream_min_tps == pytest.approx(100.0)
    assert m.aggregate_tps == pytest.approx(100.0)  # the burst's zero-length span is no throughput
    assert summarize([[burst]], [1.0]).aggregate_tps is None


def test_failed_streams_count_as_errors_not_rates():
    ok = stream(51, 0, 0.1, 1.1)
    bad = stream(0, 0, None, None, requested=50, error="server closed the connection")
    m = summarize([[ok, bad]], [1.0])
    assert (m.errors, m.completed) == (1, 1)
    assert m.first_error == "server closed the connection"
    assert m.per_stream_median_tps == pytest.approx(50.0)


def test_info_metric_labels_parsed():
    text = ('# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{block_size="16",gpu_memory_utilization="0.4",cache_dtype="fp8"} 1.0\n'
            'vllm_spark_info{moe_backend="marlin",vllm_version="0.32.0",device="NVIDIA GB10"} 1.0\n')
    cc = parse_info_metric(text, "vllm:cache_config_info")
    assert cc == {"block_size": "16", "gpu_memory_utilization": "0.4", "cache_dtype": "fp8"}
    info = ServerInfo(endpoint="http://x", model="m", cache_config=cc,
                      spark_info=parse_info_metric(text, "vllm_spark_info"))
    recipe = info.recipe()
    assert "gpu_memory_utilization=0.4" in recipe and "moe_backend=marlin" in recipe
    assert parse_info_metric(text, "absent_metric") == {}


def test_prompt_sets_and_distinct_unique_prompts():
    sets = prompt_sets()
    assert len(sets["code"]) == 16 and len(sets["prose"]) == 16
    assert len(set(sets["code"])) == 16 and len(set(sets["prose"])) == 16
    f = PromptFactory("run1")
    code = make_workload("code")
    wave = [f.prompt(code, i, token_ids=False) for i in range(16)]
    assert len(set(wave)) == 16
    again = [f.prompt(code, i, token_ids=False) for i in range(16)]
    assert not set(wave) & set(again)  # unique per request: no prefix-cache hit between waves
    plain = PromptFactory("run1", unique=False)
    assert plain.prompt(code, 3, False) == sets["code"][3]


def test_random_prompts_exact_token_ids_or_words():
    f = PromptFactory("r", token_pool=[5, 6, 7], seed=1)
    ids = f.random_prompt(32, token_ids=True)
    assert len(ids) == 32 and set(ids) <= {5, 6, 7}
    text = PromptFactory("r", tokens_per_word=2.0, seed=1).random_prompt(100, token_ids=True)  # no pool
    assert isinstance(text, str) and len(text.split()) == 51  # tag + 50 words


def test_workload_defaults_follow_seed_003():
    assert make_workload("code").temperature == 0.0 and make_workload("code").output_tokens == 1000
    prose = make_workload("prose")
    assert prose.temperature == 0.7 and 300 <= prose.output_tokens <= 600
    assert make_workload("prose", output_tokens=32).output_tokens == 32
    with pytest.raises(ValueError, match="unknown workload 'poetry'"):
        make_workload("poetry")


def test_dip_found_from_inter_token_gaps():
    # 3 streams at 100 tok/s; between t=1.0 and t=2.0 (relative) no token arrives (a 1 s prefill).
    t0 = 10.0
    streams = []
    for k in range(3):
        ts = [t0 - 1.0 + k * 0.003 + i * 0.01 for i in range(200)]  # -1.0 .. +1.0
        ts = [x for x in ts if x < t0 + 1.0] + [t0 + 2.0 + i * 0.01 for i in range(50)]
        ts += [t0 + 2.8 + i * 0.01 for i in range(50)]  # a later slow spell, not the long prompt's doing
        streams.append(ts)
    ts, rates = rate_timeline(streams, t0, -1.0, 3.0, 0.005)
    base = sorted(r for t, r in zip(ts, rates) if t < 0 and r)[len([1 for t, r in zip(ts, rates) if t < 0 and r]) // 2]
    assert base == pytest.approx(100.0, rel=0.01)
    dip = find_dip(ts, rates, base, 0.5, 0.005, streams, t0, until=2.2)
    assert dip["detected"]
    assert find_dip(ts, rates, base, 0.5, 0.005, streams, t0)["duration_s"] > 1.7  # unbounded search
    assert dip["start_s"] == pytest.approx(1.0, abs=0.02)
    assert dip["duration_s"] == pytest.approx(1.0, abs=0.03)
    assert dip["min_tokens_per_second"] == pytest.approx(1.0, rel=0.05)
    assert find_dip(ts, rates, base, 0.001, 0.005, streams, t0) == {"detected": False}


def test_endpoint_normalization():
    assert normalize_endpoint("localhost:8000") == "http://localhost:8000"
    assert normalize_endpoint("http://h:1/v1/") == "http://h:1"
    with pytest.raises(ValueError):
        normalize_endpoint("  ")


def _args(argv):
    p = argparse.ArgumentParser()
    bench_cli.add_arguments(p)
    return p.parse_args(argv)


def test_bad_options_named_in_errors(capsys):
    with pytest.raises(SystemExit):
        _args(["--levels", "1,0,4"])
    assert "concurrency levels must be integers >= 1" in capsys.readouterr().err
    assert bench_cli.run(_args(["--workload", "code,poetry"])) == bench_cli.EXIT_USAGE
    assert "unknown workload 'poetry'" in capsys.readouterr().err
    assert bench_cli.run(_args(["--endpoint", "a:1", "--endpoint", "b:1", "--model", "x", "--model", "y",
                                "--model", "z"])) == bench_cli.EXIT_USAGE
    assert "--model given 3 times for 2 endpoints" in capsys.readouterr().err
    assert bench_cli.run(_args(["--requests", "5"])) == bench_cli.EXIT_USAGE
    assert "closed-loop only" in capsys.readouterr().err


def test_window_rates_take_the_streams_that_ran_through_the_prefill():
    from vllm_spark_plugin.bench.scenarios import window_rates
    steady = [i * 0.01 for i in range(300)]                   # 100 tok/s from 0 to 3 s
    held = [i * 0.01 for i in range(100)] + [2.0 + i * 0.01 for i in range(100)]  # nothing from 1 to 2 s
    late = [1.5 + i * 0.01 for i in range(100)]               # started inside the window
    rates = window_rates([steady, held, late], 0.95, 2.05)
    assert len(rates) == 2
    assert rates[0] == pytest.approx(110 / 1.1, rel=0.02)
    assert rates[1] == pytest.approx(11 / 1.1, rel=0.1) and min(rates) == rates[1]
    assert window_rates([steady], 2.0, 2.0) == []
