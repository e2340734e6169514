"""The SLO guard's decisions, apart from vLLM: `policy` holds the admission cap (capacity under both
SLOs at the first floor, the step-time tail priced in, with hysteresis and bounds), the prefill budget a step can take while decode
streams run, the record of requests held back, and `Guard`, which keeps the engine core's live fit
and refits it on a timer.

Pure Python over the knee fit (`knee/`): no vLLM imports, every clock injected.  The hook that applies
the decisions to vLLM's scheduler is `hooks.guard` (docs/guard.md).
"""
from .policy import (MODES, MIN_PREFILL_CHUNK, AdmissionPolicy, Deferred, Guard, StepDecision,
                     capacity_at_rate, prefill_budget, tail_factor, usable)

__all__ = ["MODES", "MIN_PREFILL_CHUNK", "AdmissionPolicy", "Deferred", "Guard", "StepDecision",
           "capacity_at_rate", "prefill_budget", "tail_factor", "usable"]
