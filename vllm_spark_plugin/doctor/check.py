"""One `vllm-spark doctor` check, its statuses, and the one containment every check runs under
(shared by every doctor module)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
NA = "n/a"  # the check does not apply on this machine; its detail says why
STATUSES = (OK, INFO, WARN, FAIL, NA)
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9

# Environment variables vLLM 0.32 no longer reads, and what replaced them.
STALE_ENV = ("VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_FLASHINFER_MOE_BACKEND", "VLLM_NVFP4_GEMM_BACKEND")
BROKEN_FIX = "a doctor check raised instead of answering: report it with this line; the other checks ran"


@dataclass
class Check:
    name: str
    status: str  # one of STATUSES
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r}: status {self.status!r} is not one of {', '.join(STATUSES)}")


def contained(name: str, check: Callable[..., Check | Iterable[Check] | None], *args) -> list[Check]:
    """Run one check: its rows (none, one or several), or one failed row named `name` that carries
    the exception, so a broken check never hides the others nor stops the command."""
    try:
        got = check(*args)
        return [] if got is None else [got] if isinstance(got, Check) else list(got)
    except Exception as exc:  # noqa: BLE001 - the containment itself
        return [Check(name, FAIL, f"check could not run: {type(exc).__name__}: {exc}", BROKEN_FIX)]
