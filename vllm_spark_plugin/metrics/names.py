"""The public metric contract: every instrument declared once (name, kind, labels, help, buckets).

Dashboards, alert rules, the benchmark and users depend on these names; change none of them without
a release note.  One prefix, no colons (Prometheus 2.x scraping prometheus-client turns `a:b` into
`a_b`).  Labels stay low-cardinality: `model_name`, `engine`, and the few enumerations noted here.

Each `_metric(...)` line is the one declaration of an instrument: `metrics.instruments.Instruments`
creates every entry of `METRICS` (as attribute `attr`), and `metrics.engine.EngineChildren` caches the
`per_engine` children of each engine from it.  A new metric is one declaration here plus the line that
writes it.
"""
from __future__ import annotations

from dataclasses import dataclass

# Bucket bounds are shared measures (the knee's TTFT capacity and the SLO rule read them too):
# defined in `definitions`, named here with the metrics they bucket.
from vllm_spark_plugin.definitions import (  # noqa: F401
    BATCH_BUCKETS,
    STEP_DURATION_BUCKETS,
    STEP_TOKEN_BUCKETS,
    STREAM_RATE_BUCKETS,
    TTFT_BUCKETS,
)

PREFIX = "vllm_spark_"
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
ENGINE = ("model_name", "engine")  # the labels of every serving series
# The configured SLO values a histogram also takes as bucket bounds (`definitions.with_slo_bounds`), so
# the rules' `le` selectors at the user's floors and TTFT SLO match a bucket whatever the values.
FLOORS, TTFT_SLO_BOUND = "floors", "ttft_slo"


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str                        # COUNTER, GAUGE (multiprocess mode "mostrecent") or HISTOGRAM
    attr: str                        # the attribute of `metrics.instruments.Instruments`
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()  # histograms: the default bounds, the public list
    slo: str = ""                    # histograms: FLOORS or TTFT_SLO_BOUND, configured values added as bounds
    # the children `EngineChildren` caches per engine: (its attribute, label values after model and engine)
    per_engine: tuple[tuple[str, tuple[str, ...]], ...] = ()


METRICS: list[Metric] = []


def _metric(short: str, kind: str, attr: str, labels: tuple[str, ...], *, help: str, buckets=(), slo: str = "",
            per_engine=()) -> str:
    """Declare one instrument; `per_engine=True`: one child per engine under the same attribute."""
    if per_engine is True:
        per_engine = ((attr, ()),)
    METRICS.append(Metric(PREFIX + short, kind, attr, tuple(labels), help, tuple(buckets), slo, tuple(per_engine)))
    return PREFIX + short


# requests in the step
STEP_BATCH_SIZE = _metric("step_batch_size", HISTOGRAM, "step_batch", ENGINE, buckets=BATCH_BUCKETS, per_engine=True,
    help="Requests scheduled in each engine step (the batch that shared the forward pass).")
STEP_TOKENS = _metric("step_tokens", HISTOGRAM, "step_tokens", ENGINE + ("phase",), buckets=STEP_TOKEN_BUCKETS,
                      per_engine=(("step_prefill", ("prefill",)), ("step_decode", ("decode",))),
    help="Tokens scheduled in each engine step, by phase (prefill or decode).")
STEP_DURATION = _metric("step_duration_seconds", HISTOGRAM, "step_duration", ENGINE, buckets=STEP_DURATION_BUCKETS, per_engine=True,
    help="Wall time of each engine step (schedule to output), seconds.")
KV_BLOCKS_USED = _metric("kv_blocks_used", GAUGE, "kv_used", ENGINE, per_engine=True,
    help="KV-cache blocks in use after the latest step.")
KV_BLOCKS_TOTAL = _metric("kv_blocks_total", GAUGE, "kv_total", ENGINE, per_engine=True,
    help="KV-cache blocks in the pool (vLLM's num_gpu_blocks).")
RUNNING = _metric("running_requests", GAUGE, "running", ENGINE, per_engine=True,
    help="Running requests after the latest step.")
WAITING = _metric("waiting_requests", GAUGE, "waiting", ENGINE, per_engine=True,
    help="Waiting requests after the latest step.")
PREEMPTIONS = _metric("preemptions_total", COUNTER, "preemptions", ENGINE, per_engine=True,
    help="Requests preempted.")
TTFT = _metric("ttft_seconds", HISTOGRAM, "ttft", ENGINE, buckets=TTFT_BUCKETS, slo=TTFT_SLO_BOUND, per_engine=True,
    help="Time to first token (queueing + prefill) of each request, seconds.")
# one per finished streamed request (delivery clock)
STREAM_RATE = _metric("stream_decode_tokens_per_second", HISTOGRAM, "stream_rate", ENGINE, buckets=STREAM_RATE_BUCKETS,
                      slo=FLOORS, per_engine=True,
    help=("Per-stream decode rate of each finished streamed request as its client receives it: (output "
          "tokens - tokens of the first chunk) / (last chunk time - first chunk time), timed where the API "
          "server hands the tokens to the request's handler, tokens/s."))
# one per finished request (engine-core clock)
ENGINE_STREAM_RATE = _metric("engine_stream_decode_tokens_per_second", HISTOGRAM, "engine_stream_rate", ENGINE,
                             buckets=STREAM_RATE_BUCKETS, slo=FLOORS, per_engine=True,
    help=("Per-stream decode rate of each finished request as the engine core produced it: "
          "(output tokens - 1) / (last token time - first token time) on the engine core's clock, tokens/s."))
GENERATION_TOKENS = _metric("generation_tokens_total", COUNTER, "generation_tokens", ENGINE, per_engine=True,
    help="Tokens generated.")
PROMPT_TOKENS = _metric("prompt_tokens_total", COUNTER, "prompt_tokens", ENGINE, per_engine=True,
    help="Prompt tokens processed.")
REQUESTS_FINISHED = _metric("requests_finished_total", COUNTER, "finished", ENGINE + ("reason",),
    help="Requests finished, by reason.")
# knee (online estimator)
KNEE_BATCH = _metric("knee_batch_size", GAUGE, "knee", ENGINE,  # K = alpha/beta
    help="Live knee estimate K = alpha/beta of the step-time model t(b) = alpha + beta*b, streams.")
MAX_THROUGHPUT = _metric("max_throughput_tokens_per_second", GAUGE, "max_throughput", ENGINE,  # plateau 1/beta
    help="Live plateau 1/beta of the step-time model, tokens/s.")
CAPACITY_STREAMS = _metric("capacity_streams", GAUGE, "capacity", ENGINE + ("floor",),
    help="Highest batch size whose modelled per-stream rate meets the floor (label floor, tok/s).")
KNEE_RATIO = _metric("knee_ratio", GAUGE, "knee_ratio", ENGINE,  # running batch / K
    help="Mean running batch over the last refit interval divided by the live knee K.")
STEP_ALPHA = _metric("step_alpha_seconds", GAUGE, "alpha", ENGINE,  # fitted fixed cost per step
    help="Fitted fixed cost per decode step (alpha), seconds.")
STEP_BETA = _metric("step_beta_seconds", GAUGE, "beta", ENGINE,  # fitted cost per stream
    help="Fitted cost per stream per decode step (beta), seconds.")
KNEE_FIT_R2 = _metric("knee_fit_r2", GAUGE, "fit_r2", ENGINE,  # fit quality
    help="Quality (R^2) of the live step-time fit.")
KNEE_FIT_SAMPLES = _metric("knee_fit_samples", GAUGE, "fit_samples", ENGINE,  # steps in the window
    help="Engine steps in the live fit window.")
KNEE_VERDICT = _metric("knee_verdict", GAUGE, "verdict", ENGINE + ("verdict",),
    help="1 for the current verdict of the live fit (label verdict).")
PROFILE_KNEE_BATCH = _metric("profile_knee_batch_size", GAUGE, "profile_knee", ("model_name",),  # offline (sweep) knee
    help="Knee from the offline sweep profile (SPARK_PLUGIN_PROFILE), streams.")
PROFILE_MAX_THROUGHPUT = _metric("profile_max_throughput_tokens_per_second", GAUGE, "profile_max", ("model_name",),
    help="Plateau from the offline sweep profile, tokens/s.")
PROFILE_CAPACITY_STREAMS = _metric("profile_capacity_streams", GAUGE, "profile_capacity", ("model_name", "floor"),
    help="Capacity at the floor from the offline sweep profile, streams.")
# latency SLO (definitions.slo_outcome): attainment and goodput are rate() ratios of these counters
SLO_REQUESTS = _metric("slo_requests_total", COUNTER, "slo_requests", ENGINE + ("floor", "outcome"),
    help=("Finished requests by latency-SLO outcome (met, missed_ttft, missed_rate, missed_both) at each "
          "per-stream floor (label floor, tok/s)."))
SLO_OUTPUT_TOKENS = _metric("slo_output_tokens_total", COUNTER, "slo_tokens", ENGINE + ("floor", "outcome"),
    help=("Output tokens of finished requests by latency-SLO outcome at each floor; goodput = rate of "
          "outcome=\"met\"."))
TTFT_SLO = _metric("ttft_slo_seconds", GAUGE, "ttft_slo", ENGINE,  # the TTFT SLO requests are judged by
    help="The TTFT SLO finished requests are judged by, seconds.")
CAPACITY_TTFT = _metric("capacity_ttft_streams", GAUGE, "capacity_ttft", ENGINE,  # highest batch with median TTFT within the SLO
    help=("Highest batch whose observed median TTFT is within the TTFT SLO, streams (an upper bound when "
          "the verdict is 'exceeded at the smallest observed batch')."))
CAPACITY_TTFT_VERDICT = _metric("capacity_ttft_verdict", GAUGE, "capacity_ttft_verdict", ENGINE + ("verdict",),
    help="1 for the current verdict of the TTFT capacity (label verdict).")
SLO_CAPACITY = _metric("slo_capacity_streams", GAUGE, "slo_capacity", ENGINE + ("floor",),  # label floor: capacity under both SLOs
    help="Capacity under both SLOs: min(capacity at the floor, TTFT capacity), streams.")
SPARE_CAPACITY = _metric("spare_capacity_streams", GAUGE, "spare_capacity", ENGINE + ("floor",),  # label floor: SLO capacity - running
    help="Capacity under both SLOs minus the running streams (negative when overloaded), streams.")
# the SLO guard (guard/, docs/guard.md): absent while it is off
GUARD_ADMISSION_LIMIT = _metric("guard_admission_limit", GAUGE, "guard_limit", ENGINE,  # the cap on running requests in force
    help=("The SLO guard's cap on running requests in force (capacity under both SLOs at the first floor, "
          "with hysteresis), requests."))
GUARD_DEFERRED = _metric("guard_deferred_requests", GAUGE, "guard_deferred", ENGINE,  # waiting requests the cap holds back now
    help="Waiting requests the SLO guard's cap holds back now.")
# how long each admitted request was held (TTFT buckets, without the configured SLO)
GUARD_DEFERRED_SECONDS = _metric("guard_deferred_seconds", HISTOGRAM, "guard_deferred_seconds", ENGINE, buckets=TTFT_BUCKETS,
    help="How long each request the SLO guard held back waited before it was admitted, seconds.")
GUARD_PREFILL_BUDGET = _metric("guard_prefill_budget_tokens", GAUGE, "guard_budget", ENGINE,  # prefill tokens a step may take while decode runs
    help="Prefill tokens the SLO guard lets a step take while decode streams run.")
# hardware
GPU_ENERGY = _metric("gpu_energy_joules_total", COUNTER, "energy", ("gpu",),
    help="GPU energy since the plugin started (NVML total energy deltas), joules.")
GPU_POWER = _metric("gpu_power_watts", GAUGE, "power", ("gpu",),
    help="GPU power draw, watts.")
GPU_SM_CLOCK = _metric("gpu_sm_clock_hertz", GAUGE, "sm_clock", ("gpu",),
    help="GPU SM clock, hertz.")
GPU_TEMPERATURE = _metric("gpu_temperature_celsius", GAUGE, "temperature", ("gpu",),
    help="GPU temperature, degrees Celsius.")
GPU_UTILIZATION = _metric("gpu_utilization_ratio", GAUGE, "utilization", ("gpu",),  # 0-1
    help="GPU utilisation, 0-1.")
GPU_CLOCK_EVENT = _metric("gpu_clock_event_active", GAUGE, "clock_event", ("gpu", "reason"),  # 0/1, label reason
    help="1 while a clock-event (throttle) reason is active.")
UNIFIED_MEMORY = _metric("unified_memory_bytes", GAUGE, "memory", ("kind",),  # label kind=total|available|used
    help="Host/unified memory from /proc/meminfo, bytes (kind=total|available|used).")
MEMORY_PRESSURE = _metric("memory_pressure_ratio", GAUGE, "pressure", ("kind", "window"),  # label window (PSI some avg10..)
    help="Memory pressure stall information (/proc/pressure/memory), share of time 0-1.")
# unified-memory failures (common/memory_sources.py): what explains a driver allocation failure
MEMINFO = _metric("meminfo_bytes", GAUGE, "meminfo", ("field",),  # label field=MemFree|Cached|Buffers|SReclaimable|Shmem|SwapTotal|SwapFree
    help=("/proc/meminfo fields that explain a unified-memory failure, bytes "
          "(field=MemFree|Cached|Buffers|SReclaimable|Shmem|SwapTotal|SwapFree)."))
MEMORY_RECLAIMABLE = _metric("memory_reclaimable_bytes", GAUGE, "reclaimable", (),  # Cached + Buffers - Shmem + SReclaimable
    help="Memory that dropping caches gives back: Cached + Buffers - Shmem + SReclaimable, bytes.")
# label kind=some|full (PSI total deltas)
MEMORY_PRESSURE_STALL = _metric("memory_pressure_stall_seconds_total", COUNTER, "pressure_stall", ("kind",),
    help=("Time tasks stalled on memory since the plugin started (/proc/pressure/memory total deltas), "
          "seconds."))
NVRM_EVENTS = _metric("nvrm_events_total", COUNTER, "nvrm_events", ("kind",),  # label kind=nv_err_no_memory|xid (kernel log)
    help=("NVIDIA driver (NVRM) events in the kernel log since the plugin started, by kind "
          "(nv_err_no_memory, xid)."))
NVRM_XID_EVENTS = _metric("nvrm_xid_events_total", COUNTER, "nvrm_xid", ("xid",),  # label xid (the Xid code)
    help="NVIDIA driver Xid events in the kernel log since the plugin started, by Xid code.")
GPU_MEMORY = _metric("gpu_memory_bytes", GAUGE, "gpu_memory", ("gpu", "kind"),  # labels gpu, kind=total|free|used (NVML, where supported)
    help="GPU memory as NVML reports it (absent where NOT_SUPPORTED, as on GB10), bytes.")
# 0/1, label source=meminfo|psi|kernel_log|nvml_memory
MEMORY_SOURCE_AVAILABLE = _metric("memory_source_available", GAUGE, "source_available", ("source",),
    help=("1 when the memory source could be read at the last sample, 0 when not "
          "(source=meminfo|psi|kernel_log|nvml_memory)."))
# the links a multi-node deployment runs over (common/link_sources.py, docs/links.md): label interface
# (at most link_sources.MAX_INTERFACES of them), never peers or flows
LINK_RATE = _metric("link_rate_bytes_per_second", GAUGE, "link_rate", ("interface",),  # negotiated rate (absent when unknown)
    help=("Negotiated rate of the link (netdev speed, else the RDMA port's rate), bytes/s; absent while "
          "unknown (link down)."))
LINK_PORT_RATE = _metric("link_port_rate_bytes_per_second", GAUGE, "link_port_rate", ("interface",),  # the port's best supported rate (ethtool)
    help=("The fastest link mode the port supports (ethtool's supported link modes), bytes/s; absent where "
          "not known."))
LINK_TRANSMIT = _metric("link_transmit_bytes_total", COUNTER, "link_transmit", ("interface",),  # deltas since the plugin started
    help=("Bytes the interface sent since the plugin started (RDMA port counters x 4 where an RDMA port "
          "backs it, else the netdev statistics)."))
LINK_RECEIVE = _metric("link_receive_bytes_total", COUNTER, "link_receive", ("interface",),  # deltas since the plugin started
    help=("Bytes the interface received since the plugin started (RDMA port counters x 4 where an RDMA port"
          " backs it, else the netdev statistics)."))
LINK_UP = _metric("link_up", GAUGE, "link_up", ("interface",),  # 0/1, operstate up
    help=("1 while the interface's operstate is up, 0 otherwise (and for a named interface that does not "
          "exist)."))
LINK_CARRIER_CHANGES = _metric("link_carrier_changes_total", COUNTER, "link_carrier_changes", ("interface",),  # deltas since the plugin started
    help="Carrier changes (link down and up) of the interface since the plugin started.")
LINK_PCIE_SPEED = _metric("link_pcie_speed_gts", GAUGE, "link_pcie_speed", ("interface", "kind"),
    help="PCIe link speed of the interface's NIC, GT/s per lane (kind=current|max).")
LINK_PCIE_WIDTH = _metric("link_pcie_width_lanes", GAUGE, "link_pcie_width", ("interface", "kind"),
    help="PCIe link width of the interface's NIC, lanes (kind=current|max).")
LINK_EVENTS = _metric("link_events_total", COUNTER, "link_events", ("kind",),  # label kind=nic_reinit|link_down|link_up|pcie_degraded
    help=("NIC link messages in the kernel log since the plugin started, for the followed interfaces' NICs "
          "(kind=nic_reinit|link_down|link_up|pcie_degraded)."))
LINK_SOURCE_AVAILABLE = _metric("link_source_available", GAUGE, "link_source_available", ("source",),  # 0/1, label source=sysfs|rdma|kernel_log
    help="1 when the link source was read at the last sample, 0 when not (source=sysfs|rdma|kernel_log).")
LINK_INFO = _metric("link_info", GAUGE, "link_info", ("interface", "counter_source", "rdma_device", "driver"),
    help=("The followed interface (value 1): where its byte counters come from "
          "(counter_source=rdma|netdev), its RDMA device and driver ('none' when absent)."))
# plugin
PLUGIN_ERRORS = _metric("plugin_errors_total", COUNTER, "errors", ("where",),
    help="Exceptions and invalid values the plugin contained instead of letting them reach vLLM.")
INFO = _metric("info", GAUGE, "info", ("version", "vllm_version", "device", "moe_backend", "model_name", "features_off"),
    help=("Plugin build and environment (value 1); features_off names the features the installed vLLM does "
          "not support ('none' when all are on)."))
