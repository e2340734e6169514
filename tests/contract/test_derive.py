"""Derivations built on real vLLM stats objects (SchedulerStats, IterationStats, FinishedRequestStats)."""
from __future__ import annotations

import math

import pytest
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

from vllm_spark_plugin.hooks.stats import from_record, unpack
from vllm_spark_plugin.metrics.derive import derive


def sched(running=4, waiting=1, usage=0.25, **kw) -> SchedulerStats:
    return SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=usage, **kw)


def hook(step_us=20000, pre_reqs=1, pre_tok=100, dec_reqs=3, dec_tok=3, free=90, total=101, sampled=-1):
    """One scheduler-hook record as the channel delivers it (engine 0)."""
    engine, s = from_record((0, step_us, pre_reqs, pre_tok, dec_reqs, dec_tok, free, total, sampled))
    assert engine == 0
    return s


def it(gen=4, ttfts=(), finished=()) -> IterationStats:
    i = IterationStats()
    i.num_generation_tokens = gen
    i.time_to_first_tokens_iter = list(ttfts)
    i.finished_requests = list(finished)
    return i


def fin(tokens, decode, reason=FinishReason.LENGTH, prompt=10) -> FinishedRequestStats:
    return FinishedRequestStats(finish_reason=reason, num_generation_tokens=tokens, decode_time=decode,
                                num_prompt_tokens=prompt)


def test_hook_record_gives_exact_step():
    d = derive(hook())
    assert d.batch == 4                       # 1 prefill + 3 decode requests scheduled
    assert d.step_seconds == pytest.approx(0.02)
    assert (d.prefill_tokens, d.decode_tokens) == (100, 3)
    assert d.kv_total == 101 and d.kv_used == 101 - 1 - 90   # the null block is never free
    assert d.generation_tokens == 0 and d.ttfts == []  # tokens and TTFT come from vLLM's stats only
    assert d.invalid == 0


def test_vllm_stats_are_read_not_modified():
    """The plugin borrows no vLLM field: a KV connector's real entries stay as they are."""
    s = sched()
    s.num_kv_fetch_reqs_by_stage["waiting_to_start"] = 2
    d = derive(unpack(s, it(gen=4, ttfts=[0.05])))
    assert s.num_kv_fetch_reqs_by_stage == {"waiting_to_start": 2}
    assert d.ttfts == [0.05] and d.generation_tokens == 4 and d.batch == 4


def test_batch_comes_from_the_hook_once_its_records_arrive():
    s = unpack(sched(running=7), it())
    s.batch_from_running = False
    d = derive(s, config_total_blocks=201)
    assert not d.count_batch and d.batch == d.running == 7 and d.kv_used == 50  # TTFT-vs-batch still sees it


def test_without_hook_falls_back_to_running_and_usage():
    d = derive(unpack(sched(running=7, usage=0.5), it()), config_total_blocks=201)
    assert d.batch == 7
    assert d.step_seconds is None
    assert d.kv_used == 100  # 0.5 * (201 - 1)


def test_seed_stream_rate_definition():
    # 11 tokens, 0.5 s from first to last: (11 - 1) / 0.5 = 20 tok/s
    d = derive(unpack(None, it(finished=[fin(11, 0.5)])))
    assert d.stream_rates == [20.0]
    assert d.finished_reasons == ["length"]


def test_zero_and_one_token_requests_have_no_rate_and_are_not_errors():
    d = derive(unpack(None, it(gen=0, finished=[fin(0, 0.0, FinishReason.ABORT), fin(1, 0.0, FinishReason.STOP)])))
    assert d.stream_rates == []
    assert d.finished_reasons == ["abort", "stop"]
    assert d.invalid == 0


@pytest.mark.parametrize("bad", [None, math.nan, -1.0, math.inf])
def test_bad_values_are_dropped_and_counted(bad):
    s = sched(running=bad if bad is not None else None, usage=bad)
    s.num_running_reqs = bad  # as a broken engine might send
    i = it(gen=3, ttfts=[bad, 0.1], finished=[fin(10, bad)])
    d = derive(unpack(s, i), config_total_blocks=100)
    assert d.invalid >= 2
    assert d.ttfts == [0.1]
    assert d.stream_rates == []
    assert d.generation_tokens == 3
    for v in (d.batch, d.kv_used, d.running):
        assert v is None or (isinstance(v, int) and v >= 0)


def test_speculative_decoding_counts_tokens_not_steps():
    from vllm.v1.spec_decode.metrics import SpecDecodingStats
    s = sched(running=4, spec_decoding_stats=SpecDecodingStats.new(num_spec_tokens=2))
    d = derive(unpack(s, it(gen=10)))
    assert d.tokens_per_stream == pytest.approx(2.5)  # 10 tokens over 4 streams in one step
    hooked = derive(hook(pre_reqs=0, pre_tok=0, dec_reqs=4, dec_tok=12, sampled=10))
    assert hooked.tokens_per_stream == pytest.approx(2.5)
    assert derive(hook(pre_reqs=0, pre_tok=0, dec_reqs=4, dec_tok=4)).tokens_per_stream == 1.0
