"""vLLM's per-step stats objects as the plugin reads them: plain `StepStats` out of `SchedulerStats`
and `IterationStats` (API server), and out of the scheduler hook's records (`hooks.channel`).

Fields are read with `getattr` defaults: a field a release renames or drops degrades to "unknown"
and is counted in `missing`, never an exception.
"""
from __future__ import annotations

from vllm_spark_plugin.metrics.stepstats import FinishedRequest, StepStats

_MISSING = object()


def unpack(scheduler_stats, iteration_stats) -> StepStats:
    """Read vLLM's stats objects (any release in the window) into a StepStats; never modifies them."""
    s = StepStats()
    if scheduler_stats is not None:
        s.scheduler_present = True
        s.running = getattr(scheduler_stats, "num_running_reqs", _MISSING)
        s.waiting = getattr(scheduler_stats, "num_waiting_reqs", _MISSING)
        s.kv_usage = getattr(scheduler_stats, "kv_cache_usage", _MISSING)
        for name in ("running", "waiting", "kv_usage"):
            if getattr(s, name) is _MISSING:
                setattr(s, name, None)
                s.missing += 1
        s.spec_decoding = getattr(scheduler_stats, "spec_decoding_stats", None) is not None
    if iteration_stats is not None:
        if not hasattr(iteration_stats, "num_generation_tokens"):
            s.missing += 1
        s.generation_tokens = getattr(iteration_stats, "num_generation_tokens", 0)
        s.prompt_tokens = getattr(iteration_stats, "num_prompt_tokens", 0)
        s.preempted = getattr(iteration_stats, "num_preempted_reqs", 0)
        s.ttfts = getattr(iteration_stats, "time_to_first_tokens_iter", None) or []
        fin = getattr(iteration_stats, "finished_requests", None) or []
        s.finished = [FinishedRequest(
            generation_tokens=getattr(r, "num_generation_tokens", None),
            decode_seconds=getattr(r, "decode_time", None),
            prompt_tokens=getattr(r, "num_prompt_tokens", None),
            reason=_reason(getattr(r, "finish_reason", None)),
            e2e_seconds=getattr(r, "e2e_latency", None),
        ) for r in fin]
    return s


def _reason(reason) -> str:
    if reason is None:
        return "unknown"
    name = getattr(reason, "name", None) or str(reason)
    return name.lower()


def from_record(fields) -> tuple[int, StepStats]:
    """(engine index, StepStats) of one scheduler-hook record (`hooks.channel.RECORD`)."""
    engine, step_us, pre_reqs, pre_tokens, dec_reqs, dec_tokens, kv_free, kv_total, sampled = fields
    s = StepStats(scheduler_present=True, step_seconds=step_us / 1e6, prefill_reqs=pre_reqs,
                  prefill_tokens=pre_tokens, decode_reqs=dec_reqs, decode_tokens=dec_tokens,
                  kv_free_blocks=kv_free if kv_free >= 0 else None,
                  kv_total_blocks=kv_total if kv_total > 0 else None,
                  sampled_tokens=sampled if sampled >= 0 else None)
    s.running = pre_reqs + dec_reqs
    return engine, s
