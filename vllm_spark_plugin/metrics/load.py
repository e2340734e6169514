"""The load figure a router reads from `GET /get_load` (docs/deploy.md, "A fleet behind a router").

vLLM's router (`--policy power_of_two`) and SGLang's gateway poll `/get_load` on every worker, read
the integer `load` and send each request to the lower of two.  So the figure must order servers the
way a router should pick them: less spare capacity under both SLOs is a higher load, and it is never
negative (SGLang counts a negative total as a failed read).  Where a server declares several floors,
its capacity is the smallest over them (that of its highest floor): a server is preferred only for
room it has under every SLO it declares.

    spare = sum over engines of (capacity under both SLOs at the highest floor - running - waiting)
    load  = max(0, LOAD_AT_ZERO_SPARE - spare)

Waiting requests count against the spare: they hold no stream yet but will.  A server whose engines
do not all have a capacity verdict yet answers `running + waiting` (as if its capacity were
LOAD_AT_ZERO_SPARE), the in-flight count routers use by default.  The figures are the ones the last
step and the last refit published; nothing is fitted on the request path.

`server_load` is pure.  The two readers below gather its input: from this process's engines (one API
server), or from prometheus-client's multiprocess files, where every API server of a `vllm serve
--api-server-count N` reads the same most recent values /metrics shows, so each answers for the
whole server.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from vllm_spark_plugin.metrics import names as n

# The load of a server with no spare stream and no queue: one more stream of spare capacity is one
# less, one more stream over capacity is one more.  Larger than the batch a Spark runs (the deploy
# files use --max-num-seqs 64), so spare capacity is not clipped at 0 in practice.
LOAD_AT_ZERO_SPARE = 256


@dataclass(frozen=True)
class EngineFigures:
    running: int
    waiting: int
    capacity: int | None  # capacity under both SLOs, the smallest over the floors; None: no verdict yet


def server_load(engines: list[EngineFigures] | tuple[EngineFigures, ...]) -> int:
    """The `load` of a server made of `engines` (module docstring); 0 for none."""
    queued = sum(e.running + e.waiting for e in engines)
    if not engines or any(e.capacity is None for e in engines):
        return max(0, queued)
    spare = sum(e.capacity for e in engines) - queued
    return max(0, LOAD_AT_ZERO_SPARE - spare)


def _count(x) -> int:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and x > 0 else 0


def _smallest(capacities) -> int | None:
    known = [int(c) for c in capacities if c is not None and c == c]
    return min(known) if known else None


def from_engines(states) -> list[EngineFigures]:
    """Figures of this process's `metrics.engine.EngineState`s (what its last stats and refit set)."""
    return [EngineFigures(_count(st.running_now), _count(st.waiting_now), _smallest(st.slo_capacity))
            for st in states]


def from_multiprocess(directory: str, model: str) -> list[EngineFigures]:
    """Figures of every engine of `model` from prometheus-client's multiprocess files (the plugin's
    gauges are `mostrecent`: the latest value any API server wrote, as /metrics shows it)."""
    from prometheus_client.multiprocess import MultiProcessCollector
    files = glob.glob(os.path.join(directory, "gauge_mostrecent_*.db"))
    wanted = {n.RUNNING: "running", n.WAITING: "waiting", n.SLO_CAPACITY: "capacity"}
    per_engine: dict[str, dict] = {}
    for metric in MultiProcessCollector.merge(files, accumulate=False):
        field = wanted.get(metric.name)
        if field is None:
            continue
        for s in metric.samples:
            if s.labels.get("model_name") != model:
                continue
            f = per_engine.setdefault(s.labels.get("engine", "0"), {"capacity": []})
            if field == "capacity":
                f["capacity"].append(s.value)  # one per floor
            else:
                f[field] = s.value
    return [EngineFigures(_count(f.get("running")), _count(f.get("waiting")), _smallest(f["capacity"]))
            for _, f in sorted(per_engine.items())]
