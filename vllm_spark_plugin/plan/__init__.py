"""Capacity planner: memory fit, decode step-time model, knee, capacity and TTFT from model and
hardware specs (`vllm-spark plan`).

Modules: `arch` (config.json -> architecture, parameter counts), `formats` (bits per weight, KV and
state bytes), `hardware` (profiles; packaged JSON in `profiles/`), `deployment` (per-node sizes under
tp/pp), `memory` (the memory fit), `stepmodel` (t(b), knee, capacity, TTFT), `calibrate` (fit and
save the efficiency factors), `links` (a measured link rate in place of the profile's), `planner`
(the JSON plan, with what a measured link costs), `report` (table and plot), `published` (published
Spark figures vs prediction), `cli`.
"""
