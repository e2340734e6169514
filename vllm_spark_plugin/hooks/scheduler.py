"""The per-step hook in the engine-core process: wraps vLLM's v1 `Scheduler.schedule` and
`Scheduler.update_from_output` (no `--scheduler-cls` needed) and sends each step's wall time,
prefill/decode composition and KV blocks to the API server over the plugin's own channel
(`hooks.channel`).  vLLM's stats objects are left untouched.

Registered in `hooks.PATCHES`; switched on only when `vllm.capabilities.step_hook()` passes.
"""
from __future__ import annotations

import logging
import time

from vllm_spark_plugin.hooks import after_import, channel, patching
from vllm_spark_plugin.metrics.step import NOT_COUNTED, HookStep
from vllm_spark_plugin.vllm import quirks
from vllm_spark_plugin.vllm.capabilities import SCHEDULER_MODULE

log = logging.getLogger("vllm_spark_plugin")

PATCH = "scheduler_hook"
GUARD_STATE = "_vllm_spark_guard"  # where hooks.guard keeps its per-scheduler state (fed from the step values here)


class _HookState:
    __slots__ = ("pending", "last_end", "busy", "writer", "engine")

    def __init__(self, writer: channel.StepWriter | None, engine: int) -> None:
        self.pending: dict[int, float] = {}  # id(scheduler_output) -> schedule start
        self.last_end = 0.0
        self.busy = False  # requests were left running or waiting when the last step ended
        self.writer = writer
        self.engine = engine


def composition(so) -> tuple[int, int, int, int]:
    """(prefill_reqs, prefill_tokens, decode_reqs, decode_tokens) of one SchedulerOutput.

    A request is in prefill if it is new this step or a cached request with no output token yet
    (a continuing chunked prefill), as vLLM's own `compute_iteration_details` counts it; written
    to be O(new requests) in the common pure-decode step.  Releases whose cached-request data has
    no `num_output_tokens` count a continuing chunked prefill as decode (`quirks.cached_output_tokens`).
    """
    nst = so.num_scheduled_tokens
    total_tokens = so.total_num_scheduled_tokens
    pre_reqs = 0
    pre_tokens = 0
    for r in so.scheduled_new_reqs:
        pre_reqs += 1
        pre_tokens += nst.get(r.req_id, 0)
    cached = so.scheduled_cached_reqs
    outs = quirks.cached_output_tokens(cached)
    if outs and 0 in outs:
        for rid, n_out in zip(cached.req_ids, outs):
            if n_out == 0:
                pre_reqs += 1
                pre_tokens += nst.get(rid, 0)
    return pre_reqs, pre_tokens, len(nst) - pre_reqs, total_tokens - pre_tokens


def _sampled_tokens(so, mro) -> int:
    """Tokens the step produced, only where speculative decoding makes it differ from one per
    decoding stream (O(batch), so not counted otherwise); NOT_COUNTED otherwise."""
    if not getattr(so, "scheduled_spec_decode_tokens", None):
        return NOT_COUNTED
    sampled = getattr(mro, "sampled_token_ids", None)
    return sum(len(t) for t in sampled) if sampled is not None else NOT_COUNTED


def install(patch, settings, on_error, **_context) -> None:
    """Wrap the v1 Scheduler now, or as soon as its module is imported (engine core only)."""

    after_import.patch_when_imported(SCHEDULER_MODULE, patch.probe,
                                     lambda module: patch_scheduler(module.Scheduler, on_error), on_error,
                                     "scheduler_hook_install", "per-step hook off in this engine core")


def _engine_index(scheduler) -> int:
    pc = getattr(getattr(scheduler, "vllm_config", None), "parallel_config", None)
    rank = getattr(pc, "data_parallel_rank", 0)
    return rank if isinstance(rank, int) and rank >= 0 else 0


def _new_state(scheduler) -> _HookState:
    directory = channel.run_dir()
    writer = channel.StepWriter(directory) if directory else None
    state = _HookState(writer, _engine_index(scheduler))
    log.info("vllm-spark-plugin: scheduler hook active in this engine core (%s, engine %d, %s)",
             type(scheduler).__name__, state.engine,
             f"steps to {writer.address}" if writer else "no run directory: steps are not exported")
    return state


def patch_scheduler(Scheduler, on_error) -> None:
    """`on_error(where, exc)` is called (never raises) when the hook's own code fails; vLLM's result
    is returned untouched in that case."""

    if patching.marked(Scheduler, PATCH):
        return
    orig_schedule = Scheduler.schedule
    orig_update = Scheduler.update_from_output
    perf = time.perf_counter

    def schedule(self, *args, **kwargs):
        t0 = perf()
        out = orig_schedule(self, *args, **kwargs)
        try:
            st = self.__dict__.get("_vllm_spark_state")
            if st is None:
                st = self.__dict__["_vllm_spark_state"] = _new_state(self)
            if len(st.pending) > 64:  # outputs that never came back (aborted engine steps)
                st.pending.clear()
            st.pending[id(out)] = t0
        except Exception as exc:
            on_error("scheduler_hook", exc)
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = orig_update(self, scheduler_output, model_runner_output)
        try:
            end = perf()
            st = self.__dict__.get("_vllm_spark_state")
            if st is not None:
                t0 = st.pending.pop(id(scheduler_output), None)
                if t0 is not None and scheduler_output.total_num_scheduled_tokens > 0:
                    # A step lasts from the previous step's end while the engine stayed busy (so the
                    # engine loop's own work between steps counts: it is part of every token's cost,
                    # and with async scheduling the next step is scheduled before this one ends),
                    # else from its schedule() call (after idle time).
                    start = st.last_end if (st.busy and st.last_end) else t0
                    st.last_end = end
                    st.busy = quirks.has_unfinished_requests(self)
                    guard = self.__dict__.get(GUARD_STATE)  # hooks.guard's state: None while the guard is off
                    if st.writer is not None or guard:
                        pr, pt, dr, dt = composition(scheduler_output)
                        sampled = _sampled_tokens(scheduler_output, model_runner_output)
                        step_us = int((end - start) * 1e6)
                        fields = guard.step_fields(pr + dr, pt, step_us, sampled) if guard else ()
                        if st.writer is not None:
                            pool = self.kv_cache_manager.block_pool
                            st.writer.add(HookStep(st.engine, step_us, pr, pt, dr, dt, pool.get_num_free_blocks(),
                                                   pool.num_gpu_blocks, sampled, *fields))
                            if not st.busy:
                                st.writer.flush()  # idle now: the last steps must not wait for the next load
        except Exception as exc:
            on_error("scheduler_hook", exc)
        return outputs

    patching.replace(PATCH, Scheduler, "schedule", schedule)
    patching.replace(PATCH, Scheduler, "update_from_output", update_from_output)
    patching.mark(Scheduler, PATCH)
