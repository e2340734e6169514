"""The ONE module that touches vLLM internals.  Everything else talks to the plain types below.

vLLM documents `SchedulerStats`, `IterationStats` and the scheduler as unstable.  Supporting a new
vLLM release means checking this file against it: the accessors read fields with `getattr`
defaults so a renamed field degrades to "unknown" instead of an exception, and `SUPPORTED` says which
releases were checked.

How per-step truth reaches the API server
-----------------------------------------
vLLM's API server sees `SchedulerStats` once per engine step, but not the step's wall time nor its
exact prefill/decode composition.  The plugin wraps `Scheduler.schedule` and
`Scheduler.update_from_output` in the engine-core process (no `--scheduler-cls` flag needed) and
adds a few integer entries to `SchedulerStats.num_kv_fetch_reqs_by_stage`, a declared
`dict[str, int]` field that survives the msgspec trip between processes (fields of a subclass would
be dropped).  The plugin's stat logger, which vLLM calls before its own loggers, pops those entries
again, so vLLM's own logging never sees them.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

log = logging.getLogger("vllm_spark_plugin")

# vLLM releases whose internals this module was checked against.
SUPPORTED = ((0, 32), (0, 33))

# Keys carried in SchedulerStats.num_kv_fetch_reqs_by_stage (values are ints).
_K = "spark_plugin/"
K_STEP_US = _K + "step_us"
K_PREFILL_TOKENS = _K + "prefill_tokens"
K_DECODE_TOKENS = _K + "decode_tokens"
K_PREFILL_REQS = _K + "prefill_reqs"
K_DECODE_REQS = _K + "decode_reqs"
K_KV_FREE = _K + "kv_free_blocks"
K_KV_TOTAL = _K + "kv_total_blocks"
_ALL_KEYS = (K_STEP_US, K_PREFILL_TOKENS, K_DECODE_TOKENS, K_PREFILL_REQS, K_DECODE_REQS, K_KV_FREE, K_KV_TOTAL)


def vllm_version() -> str:
    try:
        import vllm
        return str(getattr(vllm, "__version__", "unknown"))
    except Exception:
        return "not installed"


def version_tuple(v: str | None = None) -> tuple[int, int]:
    v = v or vllm_version()
    try:
        major, minor = v.split(".")[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
    except ValueError:
        return (0, 0)


def is_supported(v: str | None = None) -> bool:
    return version_tuple(v) in SUPPORTED


# --------------------------------------------------------------------------------------------------
# Plain types the rest of the plugin uses
# --------------------------------------------------------------------------------------------------
@dataclass
class FinishedRequest:
    generation_tokens: int | None
    decode_seconds: float | None  # first token -> last token, engine-core clock
    prompt_tokens: int | None
    reason: str


@dataclass
class StepStats:
    """One engine step as the API server receives it (None = not known)."""

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None  # 0..1, excludes vLLM's null block
    # from the scheduler hook (None when the hook is off or the step came from elsewhere)
    step_seconds: float | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    prefill_reqs: int | None = None
    decode_reqs: int | None = None
    kv_free_blocks: int | None = None
    kv_total_blocks: int | None = None
    spec_decoding: bool = False
    # from IterationStats
    generation_tokens: int = 0
    prompt_tokens: int = 0
    preempted: int = 0
    ttfts: list = field(default_factory=list)
    finished: list = field(default_factory=list)

    @property
    def has_scheduler_stats(self) -> bool:
        return self.running is not None


def unpack(scheduler_stats, iteration_stats) -> StepStats:
    """Read vLLM's stats objects into a StepStats.  Pops the plugin's transport entries."""
    s = StepStats()
    if scheduler_stats is not None:
        s.running = getattr(scheduler_stats, "num_running_reqs", None)
        s.waiting = getattr(scheduler_stats, "num_waiting_reqs", None)
        s.kv_usage = getattr(scheduler_stats, "kv_cache_usage", None)
        s.spec_decoding = getattr(scheduler_stats, "spec_decoding_stats", None) is not None
        carried = getattr(scheduler_stats, "num_kv_fetch_reqs_by_stage", None)
        if carried and K_STEP_US in carried:
            us = carried.pop(K_STEP_US)
            s.step_seconds = us / 1e6 if isinstance(us, (int, float)) else None
            s.prefill_tokens = carried.pop(K_PREFILL_TOKENS, None)
            s.decode_tokens = carried.pop(K_DECODE_TOKENS, None)
            s.prefill_reqs = carried.pop(K_PREFILL_REQS, None)
            s.decode_reqs = carried.pop(K_DECODE_REQS, None)
            s.kv_free_blocks = carried.pop(K_KV_FREE, None)
            s.kv_total_blocks = carried.pop(K_KV_TOTAL, None)
    if iteration_stats is not None:
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
        ) for r in fin]
    return s


def _reason(reason) -> str:
    if reason is None:
        return "unknown"
    name = getattr(reason, "name", None) or str(reason)
    return name.lower()


# --------------------------------------------------------------------------------------------------
# Stat logger base class and config accessors (API-server process)
# --------------------------------------------------------------------------------------------------
def stat_logger_base():
    from vllm.v1.metrics.loggers import StatLoggerBase
    return StatLoggerBase


def num_gpu_blocks(vllm_config) -> int | None:
    n = getattr(getattr(vllm_config, "cache_config", None), "num_gpu_blocks", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def model_name(vllm_config) -> str:
    mc = getattr(vllm_config, "model_config", None)
    name = getattr(mc, "served_model_name", None) or getattr(mc, "model", None) or "unknown"
    if isinstance(name, (list, tuple)):
        name = name[0] if name else "unknown"
    return str(name)


def api_server_count(vllm_config) -> int:
    pc = getattr(vllm_config, "parallel_config", None)
    return int(getattr(pc, "_api_process_count", 1) or 1)


def device_name() -> str:
    try:
        from vllm.platforms import current_platform
        if current_platform.is_cpu():
            return "cpu"
        return str(current_platform.get_device_name())
    except Exception:
        return "unknown"


def device_capability() -> tuple[int, int] | None:
    try:
        from vllm.platforms import current_platform
        cap = current_platform.get_device_capability()
        return None if cap is None else (int(cap.major), int(cap.minor))
    except Exception:
        return None


# --------------------------------------------------------------------------------------------------
# Scheduler hook (engine-core process)
# --------------------------------------------------------------------------------------------------
_HOOK_ATTR = "_vllm_spark_hooked"


class _HookState:
    __slots__ = ("pending", "last_end")

    def __init__(self) -> None:
        self.pending: dict[int, float] = {}  # id(scheduler_output) -> schedule start
        self.last_end = 0.0


def _composition(so) -> tuple[int, int, int, int]:
    """(prefill_reqs, prefill_tokens, decode_reqs, decode_tokens) of one SchedulerOutput.

    A request is in prefill if it is new this step or a cached request with no output token yet
    (a continuing chunked prefill), as vLLM's own `compute_iteration_details` counts it; written
    to be O(new requests) in the common pure-decode step.
    """
    nst = so.num_scheduled_tokens
    total_tokens = so.total_num_scheduled_tokens
    pre_reqs = 0
    pre_tokens = 0
    for r in so.scheduled_new_reqs:
        pre_reqs += 1
        pre_tokens += nst.get(r.req_id, 0)
    cached = so.scheduled_cached_reqs
    outs = getattr(cached, "num_output_tokens", None)
    if outs and 0 in outs:
        for rid, n_out in zip(cached.req_ids, outs):
            if n_out == 0:
                pre_reqs += 1
                pre_tokens += nst.get(rid, 0)
    return pre_reqs, pre_tokens, len(nst) - pre_reqs, total_tokens - pre_tokens


def install_scheduler_hook(on_error) -> bool:
    """Wrap the v1 Scheduler so each step's stats carry wall time, composition and KV blocks.

    `on_error(where, exc)` is called (never raises) when the hook's own code fails; vLLM's result is
    returned untouched in that case.  Returns True when the hook is (already) installed.
    """
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler, _HOOK_ATTR, False):
        return True
    orig_schedule = Scheduler.schedule
    orig_update = Scheduler.update_from_output
    perf = time.perf_counter

    def schedule(self, *args, **kwargs):
        t0 = perf()
        out = orig_schedule(self, *args, **kwargs)
        try:
            st = self.__dict__.get("_vllm_spark_state")
            if st is None:
                st = self.__dict__["_vllm_spark_state"] = _HookState()
                log.info("vllm-spark-plugin: scheduler hook active in this engine core (%s)",
                         type(self).__name__)
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
                    # With async scheduling the next step is scheduled before this one ends:
                    # the step then lasts from the previous step's end (the pipelined period).
                    start = t0 if t0 > st.last_end else st.last_end
                    st.last_end = end
                    stats = None
                    for eco in outputs.values():
                        stats = getattr(eco, "scheduler_stats", None)
                        if stats is not None:
                            break
                    if stats is not None:
                        pr, pt, dr, dt = _composition(scheduler_output)
                        pool = self.kv_cache_manager.block_pool
                        carried = stats.num_kv_fetch_reqs_by_stage
                        carried[K_STEP_US] = int((end - start) * 1e6)
                        carried[K_PREFILL_REQS] = pr
                        carried[K_PREFILL_TOKENS] = pt
                        carried[K_DECODE_REQS] = dr
                        carried[K_DECODE_TOKENS] = dt
                        carried[K_KV_FREE] = pool.get_num_free_blocks()
                        carried[K_KV_TOTAL] = pool.num_gpu_blocks
        except Exception as exc:
            on_error("scheduler_hook", exc)
        return outputs

    Scheduler.schedule = schedule
    Scheduler.update_from_output = update_from_output
    setattr(Scheduler, _HOOK_ATTR, True)
    return True


def process_role() -> str:
    """'engine_core', 'worker' or 'api_server' (best effort, for logs and the load test)."""
    import multiprocessing
    name = multiprocessing.current_process().name
    if name.startswith("EngineCore"):
        return "engine_core"
    if "Worker" in name or "worker" in name.lower():
        return "worker"
    return "api_server" if name == "MainProcess" else name


def is_finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

# ---- quantization / MoE backend interface (see vllm_spark_plugin.quant) appended below ----
