"""The user's SLOs and thresholds, shared by the dashboards and the alert rules.

The TTFT SLO and the floor are checked by the SLO rule the exporter's settings use too
(`definitions.check_ttft_slo` / `check_floor`: any positive, finite number), so the SLO the rules are
generated from is one the exporter accepts, and the reverse.  The server makes its TTFT SLO and each of
its floors a histogram bucket bound, so the rules' `le` selectors are exact when they are generated
with the values the server runs with (`SPARK_PLUGIN_TTFT_SLO_SECONDS`, one of `SPARK_PLUGIN_FLOORS`).
`SLOError` is re-exported here for the generator's callers.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from vllm_spark_plugin.definitions import (
    DEFAULT_FLOOR_TOKENS_PER_SECOND,
    DEFAULT_TTFT_SLO_SECONDS,
    SLOError,
    check_floor,
    check_ttft_slo,
)

DEFAULT_RUNBOOK_BASE = "alerts/runbooks/"


@dataclass(frozen=True)
class SLOConfig:
    ttft_slo_seconds: float = DEFAULT_TTFT_SLO_SECONDS
    floor_tokens_per_second: float = DEFAULT_FLOOR_TOKENS_PER_SECOND  # seed 003's capacity reference
    knee_warn: float = 0.8                 # knee ratio (running / K) shown amber from here
    knee_crit: float = 1.0                 # ... red from here; "serving past the knee"
    ttft_slo_target: float = 0.99          # share of requests whose TTFT must be <= the SLO
    rate_slo_target: float = 0.95          # share of requests whose per-stream rate must be > floor
    attainment_target: float = 0.99        # share of requests meeting both (definitions.slo_outcome)
    min_requests: int = 20                 # burn-rate alerts stay silent below this many requests
    job: str = "vllm"                      # Prometheus job scraping vLLM (for up / absent alerts)
    link_share: float = 0.25               # a link carrying less than this share of its rate while steps are slow alerts
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE

    def validate(self) -> "SLOConfig":
        for flag, value, check in (("--ttft-slo", self.ttft_slo_seconds, check_ttft_slo),
                                   ("--floor", self.floor_tokens_per_second, check_floor)):
            try:
                check(value)
            except SLOError as exc:
                raise SLOError(f"{flag} {value:g}: {exc}") from None
        for name, v in (("--knee-warn", self.knee_warn), ("--knee-crit", self.knee_crit)):
            if not (math.isfinite(v) and v > 0):
                raise SLOError(f"{name} {v!r}: expected a positive knee ratio")
        if self.knee_warn >= self.knee_crit:
            raise SLOError(f"--knee-warn {self.knee_warn:g} must be below --knee-crit {self.knee_crit:g}")
        for name, v in (("--ttft-slo-target", self.ttft_slo_target), ("--rate-slo-target", self.rate_slo_target),
                        ("--attainment-target", self.attainment_target)):
            # the fast page fires at 14.4 x the error budget: at or above 1 it could never fire
            if not (0 < v < 1) or 14.4 * (1 - v) >= 1:
                raise SLOError(f"{name} {v!r}: expected a fraction in ({1 - 1 / 14.4:.4f}, 1), e.g. 0.99 "
                               "(the fast burn-rate page fires at 14.4 x the error budget)")
        if not (isinstance(self.link_share, (int, float)) and 0 < self.link_share < 1):
            raise SLOError(f"--link-share {self.link_share!r}: expected a fraction in (0, 1) of the link's negotiated rate")
        if self.min_requests < 0:
            raise SLOError(f"--min-requests {self.min_requests!r}: expected a count >= 0")
        if not self.job or any(c in self.job for c in '"\\\n'):
            raise SLOError(f"--job {self.job!r}: expected a plain Prometheus job name")
        return self

    def as_dict(self) -> dict:
        return asdict(self)

