"""The public metric contract: names, units and bucket bounds.

Dashboards, alert rules, the benchmark and users depend on these names; change none of them without
a release note.  One prefix, no colons (Prometheus 2.x scraping prometheus-client turns `a:b` into
`a_b`).  Labels stay low-cardinality: `model_name`, `engine`, and the few enumerations noted here.
"""
PREFIX = "vllm_spark_"

STEP_BATCH_SIZE = PREFIX + "step_batch_size"                      # histogram, requests in the step
STEP_TOKENS = PREFIX + "step_tokens"                              # histogram, label phase=prefill|decode
STEP_DURATION = PREFIX + "step_duration_seconds"                  # histogram
KV_BLOCKS_USED = PREFIX + "kv_blocks_used"                        # gauge
KV_BLOCKS_TOTAL = PREFIX + "kv_blocks_total"                      # gauge
RUNNING = PREFIX + "running_requests"                             # gauge
WAITING = PREFIX + "waiting_requests"                             # gauge
PREEMPTIONS = PREFIX + "preemptions_total"                        # counter
TTFT = PREFIX + "ttft_seconds"                                    # histogram
STREAM_RATE = PREFIX + "stream_decode_tokens_per_second"          # histogram, one per finished streamed request (delivery clock)
ENGINE_STREAM_RATE = PREFIX + "engine_stream_decode_tokens_per_second"  # histogram, one per finished request (engine-core clock)
GENERATION_TOKENS = PREFIX + "generation_tokens_total"            # counter
PROMPT_TOKENS = PREFIX + "prompt_tokens_total"                    # counter
REQUESTS_FINISHED = PREFIX + "requests_finished_total"            # counter, label reason
# knee (online estimator)
KNEE_BATCH = PREFIX + "knee_batch_size"                           # gauge K = alpha/beta
MAX_THROUGHPUT = PREFIX + "max_throughput_tokens_per_second"      # gauge plateau 1/beta
CAPACITY_STREAMS = PREFIX + "capacity_streams"                    # gauge, label floor
KNEE_RATIO = PREFIX + "knee_ratio"                                # gauge running batch / K
STEP_ALPHA = PREFIX + "step_alpha_seconds"                        # gauge, fitted fixed cost per step
STEP_BETA = PREFIX + "step_beta_seconds"                          # gauge, fitted cost per stream
KNEE_FIT_R2 = PREFIX + "knee_fit_r2"                              # gauge, fit quality
KNEE_FIT_SAMPLES = PREFIX + "knee_fit_samples"                    # gauge, steps in the window
KNEE_VERDICT = PREFIX + "knee_verdict"                            # gauge=1, label verdict
PROFILE_KNEE_BATCH = PREFIX + "profile_knee_batch_size"           # gauge, offline (sweep) knee
PROFILE_MAX_THROUGHPUT = PREFIX + "profile_max_throughput_tokens_per_second"
PROFILE_CAPACITY_STREAMS = PREFIX + "profile_capacity_streams"    # gauge, label floor
# latency SLO (definitions.slo_outcome): attainment and goodput are rate() ratios of these counters
SLO_REQUESTS = PREFIX + "slo_requests_total"                      # counter, labels floor, outcome
SLO_OUTPUT_TOKENS = PREFIX + "slo_output_tokens_total"            # counter, labels floor, outcome
TTFT_SLO = PREFIX + "ttft_slo_seconds"                            # gauge, the TTFT SLO requests are judged by
CAPACITY_TTFT = PREFIX + "capacity_ttft_streams"                  # gauge, highest batch with median TTFT within the SLO
CAPACITY_TTFT_VERDICT = PREFIX + "capacity_ttft_verdict"          # gauge=1, label verdict
SLO_CAPACITY = PREFIX + "slo_capacity_streams"                    # gauge, label floor: capacity under both SLOs
SPARE_CAPACITY = PREFIX + "spare_capacity_streams"                # gauge, label floor: SLO capacity - running
# the SLO guard (guard/, docs/guard.md): absent while it is off
GUARD_ADMISSION_LIMIT = PREFIX + "guard_admission_limit"          # gauge, the cap on running requests in force
GUARD_DEFERRED = PREFIX + "guard_deferred_requests"               # gauge, waiting requests the cap holds back now
GUARD_DEFERRED_SECONDS = PREFIX + "guard_deferred_seconds"        # histogram, how long each admitted request was held
GUARD_PREFILL_BUDGET = PREFIX + "guard_prefill_budget_tokens"     # gauge, prefill tokens a step may take while decode runs
# hardware
GPU_ENERGY = PREFIX + "gpu_energy_joules_total"                   # counter
GPU_POWER = PREFIX + "gpu_power_watts"                            # gauge
GPU_SM_CLOCK = PREFIX + "gpu_sm_clock_hertz"                      # gauge
GPU_TEMPERATURE = PREFIX + "gpu_temperature_celsius"              # gauge
GPU_UTILIZATION = PREFIX + "gpu_utilization_ratio"                # gauge 0-1
GPU_CLOCK_EVENT = PREFIX + "gpu_clock_event_active"               # gauge 0/1, label reason
UNIFIED_MEMORY = PREFIX + "unified_memory_bytes"                  # gauge, label kind=total|available|used
MEMORY_PRESSURE = PREFIX + "memory_pressure_ratio"                # gauge, label window (PSI some avg10..)
# unified-memory failures (common/memory_sources.py): what explains a driver allocation failure
MEMINFO = PREFIX + "meminfo_bytes"                                # gauge, label field=MemFree|Cached|Buffers|SReclaimable|Shmem|SwapTotal|SwapFree
MEMORY_RECLAIMABLE = PREFIX + "memory_reclaimable_bytes"          # gauge, Cached + Buffers - Shmem + SReclaimable
MEMORY_PRESSURE_STALL = PREFIX + "memory_pressure_stall_seconds_total"  # counter, label kind=some|full (PSI total deltas)
NVRM_EVENTS = PREFIX + "nvrm_events_total"                        # counter, label kind=nv_err_no_memory|xid (kernel log)
NVRM_XID_EVENTS = PREFIX + "nvrm_xid_events_total"                # counter, label xid (the Xid code)
GPU_MEMORY = PREFIX + "gpu_memory_bytes"                          # gauge, labels gpu, kind=total|free|used (NVML, where supported)
MEMORY_SOURCE_AVAILABLE = PREFIX + "memory_source_available"      # gauge 0/1, label source=meminfo|psi|kernel_log|nvml_memory
# the links a multi-node deployment runs over (common/link_sources.py, docs/links.md): label interface
# (at most link_sources.MAX_INTERFACES of them), never peers or flows
LINK_RATE = PREFIX + "link_rate_bytes_per_second"                 # gauge, negotiated rate (absent when unknown)
LINK_PORT_RATE = PREFIX + "link_port_rate_bytes_per_second"       # gauge, the port's best supported rate (ethtool)
LINK_TRANSMIT = PREFIX + "link_transmit_bytes_total"              # counter, deltas since the plugin started
LINK_RECEIVE = PREFIX + "link_receive_bytes_total"                # counter, deltas since the plugin started
LINK_UP = PREFIX + "link_up"                                      # gauge 0/1, operstate up
LINK_CARRIER_CHANGES = PREFIX + "link_carrier_changes_total"      # counter, deltas since the plugin started
LINK_PCIE_SPEED = PREFIX + "link_pcie_speed_gts"                  # gauge, labels interface, kind=current|max
LINK_PCIE_WIDTH = PREFIX + "link_pcie_width_lanes"                # gauge, labels interface, kind=current|max
LINK_EVENTS = PREFIX + "link_events_total"                        # counter, label kind=nic_reinit|link_down|link_up|pcie_degraded
LINK_SOURCE_AVAILABLE = PREFIX + "link_source_available"          # gauge 0/1, label source=sysfs|rdma|kernel_log
LINK_INFO = PREFIX + "link_info"                                  # gauge=1, labels interface, counter_source, rdma_device, driver
# plugin
PLUGIN_ERRORS = PREFIX + "plugin_errors_total"                    # counter, label where
INFO = PREFIX + "info"                                            # gauge=1

# Bucket bounds are shared measures (the knee's TTFT capacity and the SLO rule read them too):
# defined in `definitions`, named here with the metrics they bucket.
from vllm_spark_plugin.definitions import (  # noqa: E402,F401
    BATCH_BUCKETS,
    STEP_DURATION_BUCKETS,
    STEP_TOKEN_BUCKETS,
    STREAM_RATE_BUCKETS,
    TTFT_BUCKETS,
)
