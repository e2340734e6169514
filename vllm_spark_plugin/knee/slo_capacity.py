"""Capacity under both latency SLOs: the per-stream floor (from the step-time fit) and the TTFT SLO
(from the observed TTFT against the batch it joined).

Why observed TTFT and not the step model: TTFT is queueing plus prefill.  The step model gives the
prefill step (alpha + beta*b + gamma*prompt tokens) but not the queueing, which appears only when
the scheduler runs out of batch slots or KV blocks (`--max-num-seqs`, the KV pool, chunked-prefill
budgets): past that point TTFT grows with the queue while the batch stays put.  Observing it covers
both regimes with no further assumption.  The method, step by step:

1. every first token is an observation (batch of the step that produced it, TTFT);
2. observations are grouped into batch levels on the step-batch histogram's bounds (1, 2, 3, 4, 6,
   8, 12, 16, ...); a level needs at least `MIN_PER_LEVEL` observations, each level is placed at
   the median batch of its observations and summarised by its median TTFT (the seed's capacity
   reference is a median too);
3. walking the levels upward, the TTFT capacity is where the median TTFT first exceeds the SLO,
   linearly interpolated between the last level within it and the first beyond it, floored;
4. capacity under both SLOs at a floor = min(capacity at the floor, TTFT capacity).

Verdicts (`TtftCapacity.verdict`), so a caller can tell a number from a guess:

* `ok`: the SLO is crossed between two observed levels;
* `exceeded at the smallest observed batch`: the streams figure is an upper bound (one below the
  smallest batch of the lowest level), so running streams above it are certainly too many;
* `within the SLO at every observed batch`: no bound is known (streams None); capacity under both
  SLOs is then the floor's capacity, unconfirmed for TTFT beyond the largest observed batch;
* `too few points`: no level has enough observations (streams None);
* `no TTFT SLO`: none configured.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..definitions import BATCH_BUCKETS

MIN_PER_LEVEL = 5

VERDICT_OK = "ok"
VERDICT_EXCEEDED_AT_SMALLEST = "exceeded at the smallest observed batch"
VERDICT_WITHIN = "within the SLO at every observed batch"
VERDICT_TOO_FEW = "too few points"
VERDICT_NO_SLO = "no TTFT SLO"
VERDICTS = (VERDICT_OK, VERDICT_EXCEEDED_AT_SMALLEST, VERDICT_WITHIN, VERDICT_TOO_FEW, VERDICT_NO_SLO)


@dataclass(frozen=True)
class TtftCapacity:
    streams: int | None            # highest batch whose median TTFT is within the SLO (see verdict)
    verdict: str
    levels: tuple[tuple[float, float, int, float], ...] = ()  # (median batch, median TTFT, count, lowest batch)
    ttft_slo_seconds: float | None = None


def ttft_levels(batch: Sequence[float], ttft: Sequence[float],
                min_per_level: int = MIN_PER_LEVEL) -> tuple[tuple[float, float, int, float], ...]:
    """(median batch, median TTFT, count, lowest batch) per batch level with enough observations,
    ascending."""
    b = np.asarray(batch, dtype=float)
    t = np.asarray(ttft, dtype=float)
    ok = np.isfinite(b) & (b >= 1) & np.isfinite(t) & (t >= 0)
    b, t = b[ok], t[ok]
    if b.size == 0:
        return ()
    edges = np.asarray(BATCH_BUCKETS, dtype=float)
    level = np.searchsorted(edges, b, side="left")  # bucket index: b <= edges[level]
    out = []
    for lv in np.unique(level):
        sel = level == lv
        n = int(sel.sum())
        if n >= min_per_level:
            out.append((float(np.median(b[sel])), float(np.median(t[sel])), n, float(b[sel].min())))
    return tuple(out)


def ttft_capacity(batch: Sequence[float], ttft: Sequence[float], ttft_slo_seconds: float | None,
                  min_per_level: int = MIN_PER_LEVEL) -> TtftCapacity:
    """Highest batch whose median TTFT stays within the SLO, with its verdict (see the module doc)."""
    if ttft_slo_seconds is None:
        return TtftCapacity(None, VERDICT_NO_SLO)
    slo = float(ttft_slo_seconds)
    levels = ttft_levels(batch, ttft, min_per_level)
    if not levels:
        return TtftCapacity(None, VERDICT_TOO_FEW, levels, slo)
    _, t0, _, lowest = levels[0]
    if t0 > slo:
        return TtftCapacity(max(0, math.ceil(lowest) - 1), VERDICT_EXCEEDED_AT_SMALLEST, levels, slo)
    for (b0, t0, *_), (b1, t1, *_) in zip(levels, levels[1:]):
        if t1 > slo >= t0:
            c = b0 + (slo - t0) / (t1 - t0) * (b1 - b0)
            return TtftCapacity(int(math.floor(c + 1e-9)), VERDICT_OK, levels, slo)
    return TtftCapacity(None, VERDICT_WITHIN, levels, slo)


def capacity_under_both(floor_capacity: int | None, ttft: TtftCapacity) -> int | None:
    """min(capacity at the floor, TTFT capacity); either alone when the other is unknown."""
    if ttft.streams is None:
        return floor_capacity
    if floor_capacity is None:
        return ttft.streams
    return min(floor_capacity, ttft.streams)
