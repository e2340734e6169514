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
# hardware
GPU_ENERGY = PREFIX + "gpu_energy_joules_total"                   # counter
GPU_POWER = PREFIX + "gpu_power_watts"                            # gauge
GPU_SM_CLOCK = PREFIX + "gpu_sm_clock_hertz"                      # gauge
GPU_TEMPERATURE = PREFIX + "gpu_temperature_celsius"              # gauge
GPU_UTILIZATION = PREFIX + "gpu_utilization_ratio"                # gauge 0-1
GPU_CLOCK_EVENT = PREFIX + "gpu_clock_event_active"               # gauge 0/1, label reason
UNIFIED_MEMORY = PREFIX + "unified_memory_bytes"                  # gauge, label kind=total|available|used
MEMORY_PRESSURE = PREFIX + "memory_pressure_ratio"                # gauge, label window (PSI some avg10..)
# unified-memory failures (metrics/memory_sources.py): what explains a driver allocation failure
MEMINFO = PREFIX + "meminfo_bytes"                                # gauge, label field=MemFree|Cached|Buffers|SReclaimable|Shmem|SwapTotal|SwapFree
MEMORY_RECLAIMABLE = PREFIX + "memory_reclaimable_bytes"          # gauge, Cached + Buffers - Shmem + SReclaimable
MEMORY_PRESSURE_STALL = PREFIX + "memory_pressure_stall_seconds_total"  # counter, label kind=some|full (PSI total deltas)
NVRM_EVENTS = PREFIX + "nvrm_events_total"                        # counter, label kind=nv_err_no_memory|xid (kernel log)
NVRM_XID_EVENTS = PREFIX + "nvrm_xid_events_total"                # counter, label xid (the Xid code)
GPU_MEMORY = PREFIX + "gpu_memory_bytes"                          # gauge, labels gpu, kind=total|free|used (NVML, where supported)
MEMORY_SOURCE_AVAILABLE = PREFIX + "memory_source_available"      # gauge 0/1, label source=meminfo|psi|kernel_log|nvml_memory
# plugin
PLUGIN_ERRORS = PREFIX + "plugin_errors_total"                    # counter, label where
INFO = PREFIX + "info"                                            # gauge=1

# Bucket bounds.  Batch sizes are integers: bounds sit on them so "le=16" means "at most 16".
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)
STEP_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
STEP_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                         0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
# SLO-grade: TTFT SLOs must sit on a bound (0.2, 0.5, 1, 2, 3, 5 s are all bounds).
TTFT_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0)
# Per-stream decode rate: steps of at most ~10%, so a median read from the histogram is within a few
# percent of the true one from 1 tok/s (a loaded Spark) to 2,000 tok/s (a tiny model on a CPU); the
# 20 tok/s floor of seed 003 (and 5, 10, 15, 30, 40, 60) are bounds, so SLO queries are exact.
STREAM_RATE_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 26, 28,
                       30, 33, 36, 40, 44, 48, 52, 56, 60, 65, 70, 75, 80, 90, 100, 110, 120, 130, 140,
                       150, 165, 180, 200, 220, 240, 260, 280, 300, 330, 360, 400, 440, 480, 520, 560,
                       600, 650, 700, 750, 800, 900, 1000, 1100, 1200, 1350, 1500, 1750, 2000)
