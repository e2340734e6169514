"""The Prometheus instruments of the metric contract (created once per process).

They live in prometheus-client's default registry, which vLLM's `/metrics` serves; vLLM only
unregisters collectors whose names start with `vllm:`.  When vLLM runs several API servers it switches
prometheus-client to multiprocess mode: histograms and counters then add up across processes, and
gauges report the most recent value written by any process (`multiprocess_mode="mostrecent"`).
"""
from __future__ import annotations

import threading

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.metrics import names as n

LABELS = ("model_name", "engine")
_lock = threading.Lock()
_instance = None


def _gauge(name, doc, labels=LABELS, registry=REGISTRY):
    return Gauge(name, doc, labels, registry=registry, multiprocess_mode="mostrecent")


class Instruments:
    def __init__(self, registry=REGISTRY) -> None:
        r = registry
        self.step_batch = Histogram(n.STEP_BATCH_SIZE, "Requests scheduled in each engine step (the batch that shared the forward pass).",
                                    LABELS, buckets=n.BATCH_BUCKETS, registry=r)
        self.step_tokens = Histogram(n.STEP_TOKENS, "Tokens scheduled in each engine step, by phase (prefill or decode).",
                                     LABELS + ("phase",), buckets=n.STEP_TOKEN_BUCKETS, registry=r)
        self.step_duration = Histogram(n.STEP_DURATION, "Wall time of each engine step (schedule to output), seconds.",
                                       LABELS, buckets=n.STEP_DURATION_BUCKETS, registry=r)
        self.kv_used = _gauge(n.KV_BLOCKS_USED, "KV-cache blocks in use after the latest step.", registry=r)
        self.kv_total = _gauge(n.KV_BLOCKS_TOTAL, "KV-cache blocks in the pool (vLLM's num_gpu_blocks).", registry=r)
        self.running = _gauge(n.RUNNING, "Running requests after the latest step.", registry=r)
        self.waiting = _gauge(n.WAITING, "Waiting requests after the latest step.", registry=r)
        self.preemptions = Counter(n.PREEMPTIONS, "Requests preempted.", LABELS, registry=r)
        self.ttft = Histogram(n.TTFT, "Time to first token (queueing + prefill) of each request, seconds.",
                              LABELS, buckets=n.TTFT_BUCKETS, registry=r)
        self.stream_rate = Histogram(n.STREAM_RATE, "Per-stream decode rate of each finished streamed request as "
                                     "its client receives it: (output tokens - tokens of the first chunk) / (last "
                                     "chunk time - first chunk time), timed where the API server hands the tokens "
                                     "to the request's handler, tokens/s.",
                                     LABELS, buckets=n.STREAM_RATE_BUCKETS, registry=r)
        self.engine_stream_rate = Histogram(n.ENGINE_STREAM_RATE, "Per-stream decode rate of each finished request "
                                            "as the engine core produced it: (output tokens - 1) / (last token time "
                                            "- first token time) on the engine core's clock, tokens/s.",
                                            LABELS, buckets=n.STREAM_RATE_BUCKETS, registry=r)
        self.generation_tokens = Counter(n.GENERATION_TOKENS, "Tokens generated.", LABELS, registry=r)
        self.prompt_tokens = Counter(n.PROMPT_TOKENS, "Prompt tokens processed.", LABELS, registry=r)
        self.finished = Counter(n.REQUESTS_FINISHED, "Requests finished, by reason.", LABELS + ("reason",), registry=r)
        # knee (online estimator) and offline profile
        self.knee = _gauge(n.KNEE_BATCH, "Live knee estimate K = alpha/beta of the step-time model t(b) = alpha + beta*b, streams.", registry=r)
        self.max_throughput = _gauge(n.MAX_THROUGHPUT, "Live plateau 1/beta of the step-time model, tokens/s.", registry=r)
        self.capacity = _gauge(n.CAPACITY_STREAMS, "Highest batch size whose modelled per-stream rate meets the floor (label floor, tok/s).",
                               LABELS + ("floor",), registry=r)
        self.knee_ratio = _gauge(n.KNEE_RATIO, "Mean running batch over the last refit interval divided by the live knee K.", registry=r)
        self.alpha = _gauge(n.STEP_ALPHA, "Fitted fixed cost per decode step (alpha), seconds.", registry=r)
        self.beta = _gauge(n.STEP_BETA, "Fitted cost per stream per decode step (beta), seconds.", registry=r)
        self.fit_r2 = _gauge(n.KNEE_FIT_R2, "Quality (R^2) of the live step-time fit.", registry=r)
        self.fit_samples = _gauge(n.KNEE_FIT_SAMPLES, "Engine steps in the live fit window.", registry=r)
        self.verdict = _gauge(n.KNEE_VERDICT, "1 for the current verdict of the live fit (label verdict).", LABELS + ("verdict",), registry=r)
        self.profile_knee = _gauge(n.PROFILE_KNEE_BATCH, "Knee from the offline sweep profile (SPARK_PLUGIN_PROFILE), streams.", ("model_name",), registry=r)
        self.profile_max = _gauge(n.PROFILE_MAX_THROUGHPUT, "Plateau from the offline sweep profile, tokens/s.", ("model_name",), registry=r)
        self.profile_capacity = _gauge(n.PROFILE_CAPACITY_STREAMS, "Capacity at the floor from the offline sweep profile, streams.",
                                       ("model_name", "floor"), registry=r)
        # latency SLO
        self.slo_requests = Counter(n.SLO_REQUESTS, "Finished requests by latency-SLO outcome (met, missed_ttft, missed_rate, "
                                    "missed_both) at each per-stream floor (label floor, tok/s).", LABELS + ("floor", "outcome"), registry=r)
        self.slo_tokens = Counter(n.SLO_OUTPUT_TOKENS, "Output tokens of finished requests by latency-SLO outcome at each floor; "
                                  "goodput = rate of outcome=\"met\".", LABELS + ("floor", "outcome"), registry=r)
        self.ttft_slo = _gauge(n.TTFT_SLO, "The TTFT SLO finished requests are judged by, seconds.", registry=r)
        self.capacity_ttft = _gauge(n.CAPACITY_TTFT, "Highest batch whose observed median TTFT is within the TTFT SLO, streams "
                                    "(an upper bound when the verdict is 'exceeded at the smallest observed batch').", registry=r)
        self.capacity_ttft_verdict = _gauge(n.CAPACITY_TTFT_VERDICT, "1 for the current verdict of the TTFT capacity (label verdict).",
                                            LABELS + ("verdict",), registry=r)
        self.slo_capacity = _gauge(n.SLO_CAPACITY, "Capacity under both SLOs: min(capacity at the floor, TTFT capacity), streams.",
                                   LABELS + ("floor",), registry=r)
        self.spare_capacity = _gauge(n.SPARE_CAPACITY, "Capacity under both SLOs minus the running streams (negative when "
                                     "overloaded), streams.", LABELS + ("floor",), registry=r)
        # the SLO guard (absent while it is off)
        self.guard_limit = _gauge(n.GUARD_ADMISSION_LIMIT, "The SLO guard's cap on running requests in force (capacity under "
                                  "both SLOs at the first floor, with hysteresis), requests.", registry=r)
        self.guard_deferred = _gauge(n.GUARD_DEFERRED, "Waiting requests the SLO guard's cap holds back now.", registry=r)
        self.guard_deferred_seconds = Histogram(n.GUARD_DEFERRED_SECONDS, "How long each request the SLO guard held back "
                                                "waited before it was admitted, seconds.", LABELS,
                                                buckets=n.TTFT_BUCKETS, registry=r)
        self.guard_budget = _gauge(n.GUARD_PREFILL_BUDGET, "Prefill tokens the SLO guard lets a step take while decode "
                                   "streams run.", registry=r)
        # hardware
        self.energy = Counter(n.GPU_ENERGY, "GPU energy since the plugin started (NVML total energy deltas), joules.", ("gpu",), registry=r)
        self.power = _gauge(n.GPU_POWER, "GPU power draw, watts.", ("gpu",), registry=r)
        self.sm_clock = _gauge(n.GPU_SM_CLOCK, "GPU SM clock, hertz.", ("gpu",), registry=r)
        self.temperature = _gauge(n.GPU_TEMPERATURE, "GPU temperature, degrees Celsius.", ("gpu",), registry=r)
        self.utilization = _gauge(n.GPU_UTILIZATION, "GPU utilisation, 0-1.", ("gpu",), registry=r)
        self.clock_event = _gauge(n.GPU_CLOCK_EVENT, "1 while a clock-event (throttle) reason is active.", ("gpu", "reason"), registry=r)
        self.memory = _gauge(n.UNIFIED_MEMORY, "Host/unified memory from /proc/meminfo, bytes (kind=total|available|used).", ("kind",), registry=r)
        self.pressure = _gauge(n.MEMORY_PRESSURE, "Memory pressure stall information (/proc/pressure/memory), share of time 0-1.",
                               ("kind", "window"), registry=r)
        # unified-memory failures (metrics/memory_telemetry.py)
        self.meminfo = _gauge(n.MEMINFO, "/proc/meminfo fields that explain a unified-memory failure, bytes "
                              "(field=MemFree|Cached|Buffers|SReclaimable|Shmem|SwapTotal|SwapFree).", ("field",), registry=r)
        self.reclaimable = _gauge(n.MEMORY_RECLAIMABLE, "Memory that dropping caches gives back: Cached + Buffers - Shmem + SReclaimable, bytes.",
                                  (), registry=r)
        self.pressure_stall = Counter(n.MEMORY_PRESSURE_STALL, "Time tasks stalled on memory since the plugin started "
                                      "(/proc/pressure/memory total deltas), seconds.", ("kind",), registry=r)
        self.nvrm_events = Counter(n.NVRM_EVENTS, "NVIDIA driver (NVRM) events in the kernel log since the plugin started, "
                                   "by kind (nv_err_no_memory, xid).", ("kind",), registry=r)
        self.nvrm_xid = Counter(n.NVRM_XID_EVENTS, "NVIDIA driver Xid events in the kernel log since the plugin started, by Xid code.",
                                ("xid",), registry=r)
        self.gpu_memory = _gauge(n.GPU_MEMORY, "GPU memory as NVML reports it (absent where NOT_SUPPORTED, as on GB10), bytes.",
                                 ("gpu", "kind"), registry=r)
        self.source_available = _gauge(n.MEMORY_SOURCE_AVAILABLE, "1 when the memory source could be read at the last sample, 0 when not "
                                       "(source=meminfo|psi|kernel_log|nvml_memory).", ("source",), registry=r)
        # the links a multi-node deployment runs over (metrics/link_telemetry.py)
        iface = ("interface",)
        self.link_rate = _gauge(n.LINK_RATE, "Negotiated rate of the link (netdev speed, else the RDMA port's rate), "
                                "bytes/s; absent while unknown (link down).", iface, registry=r)
        self.link_port_rate = _gauge(n.LINK_PORT_RATE, "The fastest link mode the port supports (ethtool's supported "
                                     "link modes), bytes/s; absent where not known.", iface, registry=r)
        self.link_transmit = Counter(n.LINK_TRANSMIT, "Bytes the interface sent since the plugin started (RDMA port "
                                     "counters x 4 where an RDMA port backs it, else the netdev statistics).", iface, registry=r)
        self.link_receive = Counter(n.LINK_RECEIVE, "Bytes the interface received since the plugin started (RDMA port "
                                    "counters x 4 where an RDMA port backs it, else the netdev statistics).", iface, registry=r)
        self.link_up = _gauge(n.LINK_UP, "1 while the interface's operstate is up, 0 otherwise (and for a named interface "
                              "that does not exist).", iface, registry=r)
        self.link_carrier_changes = Counter(n.LINK_CARRIER_CHANGES, "Carrier changes (link down and up) of the interface "
                                            "since the plugin started.", iface, registry=r)
        self.link_pcie_speed = _gauge(n.LINK_PCIE_SPEED, "PCIe link speed of the interface's NIC, GT/s per lane "
                                      "(kind=current|max).", iface + ("kind",), registry=r)
        self.link_pcie_width = _gauge(n.LINK_PCIE_WIDTH, "PCIe link width of the interface's NIC, lanes (kind=current|max).",
                                      iface + ("kind",), registry=r)
        self.link_events = Counter(n.LINK_EVENTS, "NIC link messages in the kernel log since the plugin started, for the "
                                   "followed interfaces' NICs (kind=nic_reinit|link_down|link_up|pcie_degraded).",
                                   ("kind",), registry=r)
        self.link_source_available = _gauge(n.LINK_SOURCE_AVAILABLE, "1 when the link source was read at the last sample, "
                                            "0 when not (source=sysfs|rdma|kernel_log).", ("source",), registry=r)
        self.link_info = _gauge(n.LINK_INFO, "The followed interface (value 1): where its byte counters come from "
                                "(counter_source=rdma|netdev), its RDMA device and driver ('none' when absent).",
                                iface + ("counter_source", "rdma_device", "driver"), registry=r)
        # plugin
        self.errors = Counter(n.PLUGIN_ERRORS, "Exceptions and invalid values the plugin contained instead of letting them reach vLLM.",
                              ("where",), registry=r)
        self.info = _gauge(n.INFO, "Plugin build and environment (value 1); features_off names the features the installed vLLM "
                           "does not support ('none' when all are on).",
                           ("version", "vllm_version", "device", "moe_backend", "model_name", "features_off"),
                           registry=r)
        if registry is REGISTRY:  # the process's exporter counts contained errors; a test registry does not
            errors.bind_counter(self.errors)

    def collectors(self) -> list:
        """The plugin's own collectors (what the OpenTelemetry bridge reads; vLLM's are not among them)."""
        return [v for v in vars(self).values() if isinstance(v, (Counter, Gauge, Histogram))]


def get() -> Instruments:
    global _instance
    with _lock:
        if _instance is None:
            _instance = Instruments()
        return _instance
