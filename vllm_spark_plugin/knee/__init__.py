"""Step-time model t(b) = alpha + beta*b: robust fit, knee K = alpha/beta, plateau, SLO capacity.

Pure numpy; importable without vLLM or torch.  `fit_points` fits sweep results, `fit_steps`
per-step samples, `OnlineKneeEstimator` keeps a forgetting window of steps inside vLLM.
"""
from .fit import curve_at, fit_points, fit_steps
from .loaders import KneeInputError, load_points
from .online import OnlineKneeEstimator
from .result import (VERDICT_INVALID, VERDICT_NO_KNEE, VERDICT_NO_SPREAD, VERDICT_OK,
                     VERDICT_RETROGRADE, VERDICT_TOO_FEW, VERDICTS, KneeResult)

__all__ = ["fit_points", "fit_steps", "curve_at", "load_points", "KneeInputError",
           "OnlineKneeEstimator", "KneeResult", "VERDICTS",
           "VERDICT_OK", "VERDICT_NO_KNEE", "VERDICT_RETROGRADE", "VERDICT_TOO_FEW",
           "VERDICT_NO_SPREAD", "VERDICT_INVALID"]
