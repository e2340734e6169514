"""The metrics core: what one engine step becomes on /metrics.

`step` (the scheduler hook's record: layout and validation), `engine_stats` (vLLM's own stats of a
step, in plain types), `derive` (pure derivations), `engine` (recording: one write path per source),
`instruments` and `names` (the metric contract), `bounds` (the bucket bounds a server exports and a rules
file selects), `exporter` (the process's exporter), `telemetry`
(the background loop: hardware, memory sources, profile, other processes' errors, refits),
`knee_gauges` (what a refit publishes), `hardware` (NVML), `memory_telemetry` (unified-memory
failure signals), `link_telemetry` (the fleet's network links), `delivery` (the per-request clock the client sees), `load` (the figure GET /get_load answers routers with), `otel_bridge` (OTLP export).
docs/architecture.md has the map.
"""
