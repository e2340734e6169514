"""Derivations built on real vLLM stats objects (SchedulerStats, IterationStats, FinishedRequestStats)."""
from __future__ import annotations

import math

import pytest
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

from vllm_spark_plugin import _vllm
from vllm_spark_plugin.metrics.derive import derive


def sched(running=4, waiting=1, usage=0.25, carried=None, **kw) -> SchedulerStats:
    s = SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=usage, **kw)
    if carried:
        s.num_kv_fetch_reqs_by_stage.update(carried)
    return s


def hook(step_us=20000, pre_reqs=1, pre_tok=100, dec_reqs=3, dec_tok=3, free=90, total=101):
    return {_vllm.K_STEP_US: step_us, _vllm.K_PREFILL_REQS: pre_reqs, _vllm.K_PREFILL_TOKENS: pre_tok,
            _vllm.K_DECODE_REQS: dec_reqs, _vllm.K_DECODE_TOKENS: dec_tok, _vllm.K_KV_FREE: free, _vllm.K_KV_TOTAL: total}


def it(gen=4, ttfts=(), finished=()) -> IterationStats:
    i = IterationStats()
    i.num_generation_tokens = gen
    i.time_to_first_tokens_iter = list(ttfts)
    i.finished_requests = list(finished)
    return i


def fin(tokens, decode, reason=FinishReason.LENGTH, prompt=10) -> FinishedRequestStats:
    return FinishedRequestStats(finish_reason=reason, num_generation_tokens=tokens, decode_time=decode,
                                num_prompt_tokens=prompt)


def test_hook_values_give_exact_step():
    s = sched(carried=hook())
    d = derive(_vllm.unpack(s, it(gen=4, ttfts=[0.05])))
    assert d.batch == 4                       # 1 prefill + 3 decode requests scheduled
    assert d.step_seconds == pytest.approx(0.02)
    assert (d.prefill_tokens, d.decode_tokens) == (100, 3)
    assert d.kv_total == 101 and d.kv_used == 101 - 1 - 90   # the null block is never free
    assert d.ttfts == [0.05]
    assert d.invalid == 0


def test_transport_entries_are_removed_for_vllm_loggers():
    s = sched(carried=hook())
    s.num_kv_fetch_reqs_by_stage["waiting_to_start"] = 2
    _vllm.unpack(s, None)
    assert s.num_kv_fetch_reqs_by_stage == {"waiting_to_start": 2}


def test_without_hook_falls_back_to_running_and_usage():
    d = derive(_vllm.unpack(sched(running=7, usage=0.5), it()), config_total_blocks=201)
    assert d.batch == 7
    assert d.step_seconds is None
    assert d.kv_used == 100  # 0.5 * (201 - 1)


def test_seed_stream_rate_definition():
    # 11 tokens, 0.5 s from first to last: (11 - 1) / 0.5 = 20 tok/s
    d = derive(_vllm.unpack(None, it(finished=[fin(11, 0.5)])))
    assert d.stream_rates == [20.0]
    assert d.finished_reasons == ["length"]


def test_zero_and_one_token_requests_have_no_rate_and_are_not_errors():
    d = derive(_vllm.unpack(None, it(gen=0, finished=[fin(0, 0.0, FinishReason.ABORT), fin(1, 0.0, FinishReason.STOP)])))
    assert d.stream_rates == []
    assert d.finished_reasons == ["abort", "stop"]
    assert d.invalid == 0


@pytest.mark.parametrize("bad", [None, math.nan, -1.0, math.inf])
def test_bad_values_are_dropped_and_counted(bad):
    s = sched(running=bad if bad is not None else None, usage=bad)
    s.num_running_reqs = bad  # as a broken engine might send
    i = it(gen=3, ttfts=[bad, 0.1], finished=[fin(10, bad)])
    d = derive(_vllm.unpack(s, i), config_total_blocks=100)
    assert d.invalid >= 2
    assert d.ttfts == [0.1]
    assert d.stream_rates == []
    assert d.generation_tokens == 3
    for v in (d.batch, d.kv_used, d.running):
        assert v is None or (isinstance(v, int) and v >= 0)


def test_speculative_decoding_counts_tokens_not_steps():
    from vllm.v1.spec_decode.metrics import SpecDecodingStats
    s = sched(running=4, carried=hook(pre_reqs=0, pre_tok=0, dec_reqs=4, dec_tok=12),
              spec_decoding_stats=SpecDecodingStats.new(num_spec_tokens=2))
    d = derive(_vllm.unpack(s, it(gen=10)))
    assert d.tokens_per_stream == pytest.approx(2.5)  # 10 tokens over 4 streams in one step
