"""The loop's prior at a cold start: the step-time line (alpha, beta seconds) of a sweep's capacity
profile (`capacity_profile.json`, written by `vllm-spark bench`, named by SPARK_PLUGIN_PROFILE).
Measured steps replace it (docs/guard.md, "The loop"); without one the loop starts slow.
"""
from __future__ import annotations

import json
import math


def from_profile(path: str) -> tuple[tuple[float, float] | None, str]:
    """((alpha, beta), where from) or (None, why not).  Never raises: a missing or unreadable profile
    means a slow start, said once in the log by the caller."""
    if not path:
        return None, "no capacity profile (SPARK_PLUGIN_PROFILE): a slow start"
    try:
        with open(path, encoding="utf-8") as fh:
            prof = json.load(fh)
        a, b = float(prof["alpha_seconds"]), float(prof["beta_seconds"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"capacity profile {path} has no step-time line ({type(exc).__name__}: {exc}): a slow start"
    if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and b > 0):
        return None, f"capacity profile {path}: alpha {a!r}, beta {b!r} are not a step-time line: a slow start"
    return (a, b), f"the capacity profile {path} (alpha {a * 1e3:.2f} ms, beta {b * 1e3:.3f} ms)"
