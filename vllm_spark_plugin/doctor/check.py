"""One `vllm-spark doctor` check and its statuses (shared by every doctor module)."""
from __future__ import annotations

from dataclasses import dataclass

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
NA = "n/a"  # the check does not apply on this machine; its detail says why
STATUSES = (OK, INFO, WARN, FAIL, NA)
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9

# Environment variables vLLM 0.32 no longer reads, and what replaced them.
STALE_ENV = ("VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_FLASHINFER_MOE_BACKEND", "VLLM_NVFP4_GEMM_BACKEND")

@dataclass
class Check:
    name: str
    status: str  # one of STATUSES
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r}: status {self.status!r} is not one of {', '.join(STATUSES)}")
