"""How the model is served: engine, kernel paths, CUDA graphs, speculative decoding, expert parallelism.

These move the prediction by amounts taken from published figures (docs/plan.md, "Serving options");
they are separate from the machine factors (`stepmodel.Efficiency`) so that a calibration on one model
can be carried to another model on the same box and engine.

* Engine: per-step overhead differs between engines.  `kernel_scale` multiplies the profile's
  per-kernel latency, `host_scale` its per-step host work; `eager_kernel_seconds` is what each kernel
  costs on top when CUDA graphs are off (`--enforce-eager`).
* Kernel path: bandwidth / compute efficiency of one (engine, weight format, backend) relative to the
  machine's; routed experts go through the MoE backend, the other linears through the linear backend.
* Speculative decoding: a step verifies 1 + n tokens per stream and emits the mean acceptance length
  L of them; each draft token costs a fraction of a target step (MTP: one extra layer + lm_head).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class EngineProfile:
    kernel_scale: float
    host_scale: float
    eager_kernel_seconds: float
    source: str


# Sources and arithmetic: docs/plan.md, "Serving options".
ENGINES: dict[str, EngineProfile] = {
    "vllm": EngineProfile(1.0, 1.0, 37e-6, "profile kernel latency; eager cost from conselara.dev (59 -> 26 tok/s)"),
    "sglang": EngineProfile(1.0, 1.0, 37e-6, "no independent Spark figure: vLLM's values"),
    "trtllm": EngineProfile(1.0, 1.0, 37e-6, "no independent Spark figure: vLLM's values"),
    "llama.cpp": EngineProfile(0.25, 0.5, 0.0, "fully graphed, fused decode (llama.cpp benches/dgx-spark.md dense 7B row)"),
}

MOE_BACKENDS = ("auto", "flashinfer_cutlass", "cutlass", "marlin", "triton", "b12x", "native")
LINEAR_BACKENDS = ("auto", "flashinfer_cutlass", "cutlass", "marlin", "native")


@dataclass(frozen=True)
class PathEfficiency:
    bandwidth_scale: float = 1.0  # x the machine's bandwidth efficiency
    compute_scale: float = 1.0    # x the machine's compute efficiency
    source: str = "generic (machine factors only)"


# (engine, weight format, backend) -> efficiency relative to the machine.  "*" matches anything.
# Only entries with a published figure behind them; everything else is the generic path.
_KUBIS_N = "kubis.ai Nemotron-3-Super topology benchmark: without the SM12.1 CUTLASS patch 'FlashInfer/Marlin backends run at half speed'"
KERNEL_PATHS: dict[tuple[str, str, str], PathEfficiency] = {
    # vLLM 0.17 on SM12.1 without the CUTLASS patch: the NVFP4 paths of that release at half speed
    ("vllm-0.17", "nvfp4", "marlin"): PathEfficiency(0.5, 0.5, _KUBIS_N),
    ("vllm-0.17", "nvfp4", "flashinfer_cutlass"): PathEfficiency(0.5, 0.5, _KUBIS_N),
}


def path_efficiency(engine: str, fmt: str, backend: str) -> PathEfficiency:
    for key in ((engine, fmt, backend), (engine, fmt, "*"), (engine, "*", backend), ("*", fmt, backend)):
        if key in KERNEL_PATHS:
            return KERNEL_PATHS[key]
    return PathEfficiency()


@dataclass(frozen=True)
class SpecDecode:
    """Speculative decoding: n drafted tokens per step, L tokens emitted per step on average."""

    method: str = "mtp"            # mtp | draft
    num_tokens: int = 1
    acceptance_length: float | None = None  # None: 1 + sum of 0.85^i (published MTP acceptance)
    draft_cost: float | None = None         # seconds-fraction of a target step per draft token

    def mean_emitted(self) -> float:
        if self.acceptance_length is not None:
            return self.acceptance_length
        return 1.0 + sum(DEFAULT_ACCEPTANCE ** i for i in range(1, self.num_tokens + 1))

    def validate(self) -> None:
        if self.method not in ("mtp", "draft"):
            raise ValueError(f"speculative method must be mtp or draft, got {self.method!r}")
        if not (isinstance(self.num_tokens, int) and self.num_tokens >= 1):
            raise ValueError(f"speculative tokens must be a positive integer, got {self.num_tokens!r}")
        L = self.mean_emitted()
        if not (math.isfinite(L) and 1.0 <= L <= self.num_tokens + 1):
            raise ValueError(f"acceptance length must lie in [1, {self.num_tokens + 1}] for {self.num_tokens} "
                             f"drafted tokens, got {L!r}")
        if self.method == "draft" and self.draft_cost is None:
            raise ValueError("a separate draft model needs its cost per drafted token (fraction of a target step)")
        if self.draft_cost is not None and not (math.isfinite(self.draft_cost) and 0 <= self.draft_cost <= 1):
            raise ValueError(f"draft cost must be a fraction in [0, 1], got {self.draft_cost!r}")


# per-position MTP acceptance published for Qwen3.6 on a Spark: 85.2-85.4 % (MTP-1), 0.886 / 0.778 (MTP-2)
DEFAULT_ACCEPTANCE = 0.85


@dataclass
class Serving:
    engine: str = "vllm"
    release: str = ""              # engine release class for kernel-path lookups, e.g. "vllm-0.17"
    moe_backend: str = "auto"
    linear_backend: str = "auto"
    enforce_eager: bool = False
    expert_parallel: bool = False
    spec: SpecDecode | None = None
    routing_skew: float | None = None  # None: the model's published default

    def validate(self, tp: int = 1) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; choose from {', '.join(ENGINES)}")
        if self.moe_backend not in MOE_BACKENDS:
            raise ValueError(f"unknown MoE backend {self.moe_backend!r}; choose from {', '.join(MOE_BACKENDS)}")
        if self.linear_backend not in LINEAR_BACKENDS:
            raise ValueError(f"unknown linear backend {self.linear_backend!r}; choose from {', '.join(LINEAR_BACKENDS)}")
        if self.expert_parallel and tp < 2:
            raise ValueError("expert parallelism needs the experts spread over 2 or more ranks (tp >= 2)")
        if self.routing_skew is not None and not (math.isfinite(self.routing_skew) and self.routing_skew >= 0):
            raise ValueError(f"routing skew must be >= 0, got {self.routing_skew!r}")
        if self.spec is not None:
            self.spec.validate()

    @property
    def profile(self) -> EngineProfile:
        return ENGINES[self.engine]

    def path(self, fmt: str, backend: str) -> PathEfficiency:
        return path_efficiency(self.release or self.engine, fmt, backend)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["engine_profile"] = asdict(self.profile)
        return d
