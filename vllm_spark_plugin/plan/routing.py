"""Expected distinct routed experts one MoE layer reads for a decode step of b tokens, under skewed routing.

Uniform, independent routing (each token picks k of E experts with equal probability) touches
E * (1 - (1 - k/E)^b) experts.  Real routers are not uniform: published routing traces show a stable
per-model concentration (Gini of the per-expert token counts 0.10-0.15 for some models, above 0.24
for others; docs/plan.md, "Routing skew").  A concentrated router reads fewer distinct experts at mid
batch sizes, so the uniform term bends the predicted curve too early.

Model: expert i (ranked by popularity) is chosen by one token with probability q_i, proportional to
i^(-skew) (a Zipf profile with one parameter) and capped at 1 -- a token picks k distinct experts, so
sum(q) = k and the mass above the cap is handed to the next experts (water-filling).  Tokens of
different streams route independently, so

    distinct(b) = sum_i 1 - (1 - q_i)^b.

skew = 0 is uniform routing; skew -> inf sends every token to the same k experts (distinct = k for
every b); the curve is monotone in b for any skew.  A model's default comes from a published Gini
(or normalised-entropy concentration) of its routing, converted with `skew_for_gini` /
`skew_for_concentration`.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

MAX_SKEW = 50.0  # from here on the profile is the full-skew limit (every token picks the same k experts)


def _check(n_experts: int, top_k: int, skew: float) -> None:
    if not (isinstance(n_experts, int) and isinstance(top_k, int) and 0 < top_k <= n_experts):
        raise ValueError(f"need 0 < top_k <= n_experts, got top_k={top_k!r}, n_experts={n_experts!r}")
    if not (math.isfinite(skew) and skew >= 0):
        raise ValueError(f"routing skew must be a finite number >= 0, got {skew!r}")


@lru_cache(maxsize=2048)
def _selection_probabilities(n_experts: int, top_k: int, skew: float) -> np.ndarray:
    """Per-token probability that each expert (most popular first) is among the k chosen."""
    _check(n_experts, top_k, skew)
    if skew >= MAX_SKEW:  # the full-skew limit, exactly: every token picks the same k experts
        q = np.zeros(n_experts)
        q[:top_k] = 1.0
        q.flags.writeable = False
        return q
    logw = -skew * np.log(np.arange(1, n_experts + 1, dtype=float))
    w = np.exp(logw - logw.max())
    q = np.zeros(n_experts)
    free = np.ones(n_experts, dtype=bool)
    mass = float(top_k)
    # water-filling: experts whose share would exceed 1 are chosen by every token
    while mass > 1e-12 and free.any():
        share = mass * w * free / np.sum(w[free])
        over = free & (q + share >= 1.0)
        if not over.any():
            q[free] += share[free]
            break
        mass -= float(np.sum(1.0 - q[over]))
        q[over] = 1.0
        free &= ~over
    q.flags.writeable = False  # cached: shared by every caller
    return q


def selection_probabilities(n_experts: int, top_k: int, skew: float = 0.0) -> np.ndarray:
    return _selection_probabilities(int(n_experts), int(top_k), float(skew)).copy()


@lru_cache(maxsize=65536)
def distinct_experts(n_experts: int, top_k: int, tokens: float, skew: float = 0.0) -> float:
    """Expected distinct experts one MoE layer touches for `tokens` independently routed tokens."""
    if n_experts <= 0 or top_k <= 0 or tokens <= 0:
        return 0.0
    if skew == 0.0:  # closed form, also the reference the skewed profile must reduce to
        return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)
    q = _selection_probabilities(int(n_experts), int(top_k), float(skew))
    return float(np.sum(1.0 - (1.0 - q) ** tokens))


def gini(n_experts: int, top_k: int, skew: float) -> float:
    """Gini coefficient of the per-expert token counts a long trace would show."""
    p = np.sort(selection_probabilities(n_experts, top_k, skew))
    n = len(p)
    return float(np.sum((2 * np.arange(1, n + 1) - n - 1) * p) / (n * np.sum(p)))


def concentration(n_experts: int, top_k: int, skew: float) -> float:
    """1 - normalised entropy of the per-expert token shares (0 uniform, 1 one expert)."""
    p = selection_probabilities(n_experts, top_k, skew) / top_k
    nz = p[p > 0]
    return float(1.0 - (-np.sum(nz * np.log(nz))) / math.log(n_experts))


def _invert(metric, n_experts: int, top_k: int, target: float) -> float:
    hi_value = metric(n_experts, top_k, MAX_SKEW)
    if not 0 <= target < hi_value:
        raise ValueError(f"a routing statistic of {target} is out of reach for {top_k} of {n_experts} experts "
                         f"(0 <= value < {hi_value:.3f})")
    lo, hi = 0.0, MAX_SKEW
    for _ in range(60):  # both statistics grow monotonically with skew
        mid = 0.5 * (lo + hi)
        if metric(n_experts, top_k, mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@lru_cache(maxsize=256)
def skew_for_gini(n_experts: int, top_k: int, g: float) -> float:
    return _invert(gini, n_experts, top_k, g)


@lru_cache(maxsize=256)
def skew_for_concentration(n_experts: int, top_k: int, c: float) -> float:
    return _invert(concentration, n_experts, top_k, c)


def skew_from_routing_doc(doc: dict | None, n_experts: int, top_k: int) -> tuple[float, str]:
    """A model file's `routing` block -> (skew, where it came from).  No block: uniform (0)."""
    if not doc:
        return 0.0, "uniform (no published routing statistic for this model)"
    if "skew" in doc:
        return float(doc["skew"]), str(doc.get("source", "model file"))
    if "gini" in doc:
        return skew_for_gini(n_experts, top_k, float(doc["gini"])), f"Gini {doc['gini']} ({doc.get('source', '')})"
    if "concentration" in doc:
        return (skew_for_concentration(n_experts, top_k, float(doc["concentration"])),
                f"concentration {doc['concentration']} ({doc.get('source', '')})")
    raise ValueError("a routing block needs one of skew, gini, concentration")
