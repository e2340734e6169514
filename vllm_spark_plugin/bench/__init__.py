"""`vllm-spark bench`: the concurrency sweep measured the way the seed documents measure it.

Layered with no upward import: `client` (streaming requests, timed), `workloads` and `scenarios`
(what is sent), `adaptive` (which level to measure next under `--levels auto`, and why: pure),
`sweep` (levels, trials, flushing results as they come), `stats` and `analysis` (the
seed definitions, the fit), `results`, `report` and `plots` (CSV, JSON, HTML, PNG), `cli` (the command
and its exit codes).
"""
