"""The SLO guard's decisions, apart from vLLM: `loop` holds the admission cap as a control loop (a
step-time model that survives its own feedback, a slow start, a correction from finished requests,
bounded moves), `policies` the interface and registry of admission policies, `prior` the loop's
start from a sweep's capacity profile, and `policy` the prefill budget a step can take while decode
streams run, the record of requests held back, and `Guard`, which drives them on the engine core's
step path and refits on a timer.

Pure Python: no vLLM imports, every clock injected.  The hook that applies the decisions to vLLM's
scheduler is `hooks.guard` (docs/guard.md).
"""
from .loop import LoopPolicy
from .policies import POLICIES, AdmissionPolicy
from .policy import (MIN_PREFILL_CHUNK, MODES, Deferred, Guard, StepDecision, capacity_at_rate, prefill_budget,
                     tail_factor)

__all__ = ["MODES", "MIN_PREFILL_CHUNK", "AdmissionPolicy", "Deferred", "Guard", "LoopPolicy", "POLICIES",
           "StepDecision", "capacity_at_rate", "prefill_budget", "tail_factor"]
