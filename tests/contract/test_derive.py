"""What one engine step becomes, through the paths that run in the API server: real vLLM stats
objects (SchedulerStats, IterationStats, FinishedRequestStats) read by `hooks.stats.read` and recorded
by `EngineState.record_stats`, and the scheduler hook's record made a `HookStep` by the one validating
constructor and recorded by `EngineState.record_step`.  Each test has a registry of its own."""
from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

from vllm_spark_plugin.hooks import stats
from vllm_spark_plugin.metrics.exporter import Exporter
from vllm_spark_plugin.metrics.step import HookStep, InvalidStep
from vllm_spark_plugin.settings import Settings

MODEL = "derive-model"


class Engine:
    """Engine 0 of an exporter on a registry of its own; `value(name, **labels)` reads it back."""

    def __init__(self, hook_steps: bool, total_blocks: int | None = None) -> None:
        self.registry = CollectorRegistry()
        exp = Exporter(MODEL, Settings(), registry=self.registry, hook_steps=hook_steps)
        exp.set_total_blocks(total_blocks)
        self.st = exp.engine(0)

    def value(self, name, **labels) -> float:
        got = self.registry.get_sample_value(name, {"model_name": MODEL, "engine": "0", **labels})
        return 0.0 if got is None else got

    def invalid(self) -> float:
        return self.registry.get_sample_value("vllm_spark_plugin_errors_total", {"where": "invalid_stats"}) or 0.0


def sched(running=4, waiting=1, usage=0.25, **kw) -> SchedulerStats:
    return SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=usage, **kw)


def it(gen=4, ttfts=(), finished=()) -> IterationStats:
    i = IterationStats()
    i.num_generation_tokens = gen
    i.time_to_first_tokens_iter = list(ttfts)
    i.finished_requests = list(finished)
    return i


def fin(tokens, decode, reason=FinishReason.LENGTH, prompt=10) -> FinishedRequestStats:
    return FinishedRequestStats(finish_reason=reason, num_generation_tokens=tokens, decode_time=decode,
                                num_prompt_tokens=prompt)


def hook(step_us=20000, pre_reqs=1, pre_tok=100, dec_reqs=3, dec_tok=3, free=90, total=101, sampled=-1):
    """One scheduler-hook record as the channel delivers it (engine 0)."""
    return HookStep.from_wire((0, step_us, pre_reqs, pre_tok, dec_reqs, dec_tok, free, total, sampled))


def test_hook_record_gives_the_exact_step():
    e = Engine(hook_steps=True)
    e.st.record_step(hook())
    assert e.value("vllm_spark_step_batch_size_sum") == 4            # 1 prefill + 3 decode requests
    assert e.value("vllm_spark_step_duration_seconds_sum") == pytest.approx(0.02)
    assert e.value("vllm_spark_step_tokens_sum", phase="prefill") == 100
    assert e.value("vllm_spark_step_tokens_sum", phase="decode") == 3
    assert e.value("vllm_spark_kv_blocks_used") == 101 - 1 - 90      # the null block is never free
    assert e.value("vllm_spark_generation_tokens_total") == 0       # tokens and TTFT: vLLM's stats only
    assert e.invalid() == 0


def test_a_record_with_a_negative_count_is_refused_by_name():
    with pytest.raises(InvalidStep, match="decode_tokens = -3"):
        hook(dec_tok=-3)


def test_vllm_stats_are_read_not_modified():
    """The plugin borrows no vLLM field: a KV connector's real entries stay as they are."""
    e = Engine(hook_steps=True)
    s = sched()
    s.num_kv_fetch_reqs_by_stage["waiting_to_start"] = 2
    e.st.record_stats(stats.read(s, it(gen=4, ttfts=[0.05])))
    assert s.num_kv_fetch_reqs_by_stage == {"waiting_to_start": 2}
    assert e.value("vllm_spark_ttft_seconds_sum") == 0.05 and e.value("vllm_spark_generation_tokens_total") == 4
    assert e.value("vllm_spark_running_requests") == 4


def test_with_the_hooks_steps_the_batch_and_kv_blocks_are_theirs():
    e = Engine(hook_steps=True, total_blocks=201)
    e.st.record_stats(stats.read(sched(running=7, usage=0.5), it()))
    assert e.value("vllm_spark_step_batch_size_count") == 0          # counted once per step, by the hook
    assert e.value("vllm_spark_kv_blocks_used") == 0 and e.value("vllm_spark_running_requests") == 7


def test_without_the_hook_batch_and_kv_blocks_come_from_running_and_usage():
    e = Engine(hook_steps=False, total_blocks=201)
    e.st.record_stats(stats.read(sched(running=7, usage=0.5), it()))
    assert (e.value("vllm_spark_step_batch_size_count"), e.value("vllm_spark_step_batch_size_sum")) == (1, 7)
    assert e.value("vllm_spark_step_duration_seconds_count") == 0    # no step time without the hook
    assert e.value("vllm_spark_kv_blocks_used") == 100               # 0.5 * (201 - 1)


def test_seed_stream_rate_definition():
    e = Engine(hook_steps=True)
    e.st.record_stats(stats.read(None, it(finished=[fin(11, 0.5)])))  # (11 - 1) / 0.5 = 20 tok/s
    assert e.value("vllm_spark_engine_stream_decode_tokens_per_second_sum") == 20.0
    assert e.value("vllm_spark_requests_finished_total", reason="length") == 1


def test_zero_and_one_token_requests_have_no_rate_and_are_not_errors():
    e = Engine(hook_steps=True)
    e.st.record_stats(stats.read(None, it(gen=0, finished=[fin(0, 0.0, FinishReason.ABORT),
                                                           fin(1, 0.0, FinishReason.STOP)])))
    assert e.value("vllm_spark_engine_stream_decode_tokens_per_second_count") == 0
    assert e.value("vllm_spark_requests_finished_total", reason="abort") == 1
    assert e.value("vllm_spark_requests_finished_total", reason="stop") == 1
    assert e.invalid() == 0


@pytest.mark.parametrize("bad", [None, math.nan, -1.0, math.inf])
def test_bad_values_are_dropped_and_counted(bad):
    e = Engine(hook_steps=False, total_blocks=100)
    s = sched(usage=bad)
    s.num_running_reqs = bad  # as a broken engine might send
    e.st.record_stats(stats.read(s, it(gen=3, ttfts=[bad, 0.1], finished=[fin(10, bad)])))
    assert e.invalid() >= (2 if bad is None else 3)
    assert (e.value("vllm_spark_ttft_seconds_count"), e.value("vllm_spark_ttft_seconds_sum")) == (1, 0.1)
    assert e.value("vllm_spark_engine_stream_decode_tokens_per_second_count") == 0
    assert e.value("vllm_spark_generation_tokens_total") == 3
    assert e.value("vllm_spark_step_batch_size_count") == 0 and e.value("vllm_spark_kv_blocks_used") == 0


def test_speculative_decoding_counts_tokens_not_steps():
    assert hook(pre_reqs=0, pre_tok=0, dec_reqs=4, dec_tok=12, sampled=10).tokens_per_stream == pytest.approx(2.5)
    assert hook(pre_reqs=0, pre_tok=0, dec_reqs=4, dec_tok=4).tokens_per_stream == 1.0
