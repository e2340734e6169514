"""vLLM's per-step stats objects as the plugin reads them: a plain `EngineStats` out of
`SchedulerStats` and `IterationStats` (API server).

Fields are read with `getattr` defaults: a field a release renames or drops degrades to "unknown"
and is counted in `missing`, never an exception.  vLLM's objects are never modified.
"""
from __future__ import annotations

from vllm_spark_plugin.metrics.engine_stats import EngineStats, FinishedRequest

_MISSING = object()


def read(scheduler_stats, iteration_stats) -> EngineStats:
    """Read vLLM's stats objects (any release in the window) into an EngineStats."""
    s = EngineStats()
    if scheduler_stats is not None:
        for name, attr in (("running", "num_running_reqs"), ("waiting", "num_waiting_reqs"),
                           ("kv_usage", "kv_cache_usage")):
            v = getattr(scheduler_stats, attr, _MISSING)
            if v is _MISSING or (v is None and name == "running"):  # vLLM always fills its running count
                s.missing += 1
            elif v is not None:
                setattr(s, name, v)
    if iteration_stats is not None:
        if not hasattr(iteration_stats, "num_generation_tokens"):
            s.missing += 1
        s.generation_tokens = getattr(iteration_stats, "num_generation_tokens", 0)
        s.prompt_tokens = getattr(iteration_stats, "num_prompt_tokens", 0)
        s.preempted = getattr(iteration_stats, "num_preempted_reqs", 0)
        s.ttfts = getattr(iteration_stats, "time_to_first_tokens_iter", None) or ()
        fin = getattr(iteration_stats, "finished_requests", None)
        if fin:
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
