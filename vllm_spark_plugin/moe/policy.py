"""Which NVFP4 MoE kernel backend to use on GB10 (compute capability 12.x), and why.

Decision order (first that applies):

1. vLLM's `--moe-backend` when it is not `auto`: always wins, the plugin only reports it.
2. No CUDA device (the CPU): `reference`, the plugin dequantises NVFP4 to bf16 at load and
   runs vLLM's unquantised MoE path.
3. Device outside the 12.x family: `auto`, vLLM's own selection (the plugin has no measurements
   there and does not second-guess it).
4. The plugin setting `SPARK_PLUGIN_MOE_BACKEND` when that backend is available on this machine
   and passes the start-up self-check; otherwise a warning and step 5.
5. The first backend of `SM12X_PREFERENCE` that is available and passes the self-check.
6. None passes: `auto` (vLLM's own order), with a warning naming every failure.

Preference order on 12.x and the published GB10/SM12x measurements behind it:

* `marlin` (W4A16): seed 001 (Qwen3.6-35B-A3B-NVFP4, one Spark): Marlin recipe 40.715 aggregate
  tok/s at concurrency 1 vs 38.643 for FlashInfer CUTLASS, 557.471 vs 558.618 at 64 (a tie);
  NVIDIA's Nemotron-3-Super DGX Spark deployment guide pins Marlin
  (`VLLM_NVFP4_GEMM_BACKEND=marlin`, `VLLM_USE_FLASHINFER_MOE_FP4=0`,
  docs.nvidia.com/nemotron/.../SparkDeploymentGuide); eugr/spark-vllm-docker#60 made Marlin the
  default for NVFP4 recipes (35 -> 40 tok/s, Qwen3-Next-80B-A3B-NVFP4 on a Spark).
* `flashinfer_cutlass` (W4A4): seed 001 (above) - equal at high concurrency, 5% behind at 1;
  on sm_121 the FlashInfer autotuner skips tactics that need more than GB10's ~99 KB shared
  memory ("Failed to initialize cutlass TMA WS grouped gemm", flashinfer-ai/flashinfer#3013).
* `b12x` (PyPI `b12x`, SM120/SM121-only CuTe DSL kernels): never auto-selected by vLLM; the only
  published comparison found is on SM120, not GB10 (vllm-project/vllm#49476: flashinfer_b12x 196.2
  vs Marlin 180.6 tok/s single stream, RTX 5070 Ti, different vLLM builds), so it ranks after the
  GB10-measured backends until a Spark owner measures it (`docs/nvfp4.md` has the commands).
* `cutlass` (vLLM CUTLASS, W4A4): reported garbage output on SM120 NVFP4 MoE
  (r/LocalLLaMA "8+ hours benchmarking every MoE backend", 4x RTX PRO 6000); last, and the
  self-check is what keeps a wrong-result kernel out.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger("vllm_spark_plugin")

# vLLM `--moe-backend` values this policy chooses among on 12.x, best first.
SM12X_PREFERENCE: tuple[str, ...] = ("marlin", "flashinfer_cutlass", "b12x", "cutlass")
# Backends that quantise activations to FP4 (W4A4); the rest keep bf16 activations (W4A16).
W4A4_BACKENDS = frozenset({"flashinfer_cutlass", "cutlass", "b12x"})
REFERENCE = "reference"   # CPU path: dequantise at load, vLLM's unquantised MoE
AUTO = "auto"             # leave the choice to vLLM
NONE = "none"             # no NVFP4 MoE layer in this process (yet)

# Where the engine (worker) process publishes its decision for the API server's info metric.
STATE_ENV = "SPARK_PLUGIN_MOE_STATE"


@dataclass
class CheckResult:
    passed: bool
    detail: str
    cosine: float | None = None
    rel_error: float | None = None


@dataclass
class Decision:
    backend: str                 # a --moe-backend value, REFERENCE or AUTO
    reason: str
    source: str                  # vllm | setting | policy | reference | vllm-auto
    candidates: dict = field(default_factory=dict)  # name -> "passed ..." / "failed: ..." / "unavailable: ..."

    def log_line(self) -> str:
        tried = "; ".join(f"{k}: {v}" for k, v in self.candidates.items())
        return (f"vllm-spark-plugin: NVFP4 MoE backend {self.backend} ({self.reason})"
                + (f" [candidates: {tried}]" if tried else ""))


def is_sm12x(capability: tuple[int, int] | None) -> bool:
    return capability is not None and capability[0] == 12


def decide(capability: tuple[int, int] | None,
           available: Mapping[str, str | None],
           self_check: Callable[[str], CheckResult] | None,
           setting: str = "",
           vllm_backend: str = AUTO) -> Decision:
    """Pick the backend.  `available` maps each candidate to None (usable here) or the reason it is
    not; `self_check(name)` runs the candidate on a small MoE problem against the reference."""
    vllm_backend = (vllm_backend or AUTO).strip().lower()
    setting = (setting or "").strip().lower()
    if vllm_backend != AUTO:
        return Decision(vllm_backend, "vLLM --moe-backend always wins", "vllm")
    if capability is None:
        return Decision(REFERENCE, "no CUDA device: NVFP4 weights dequantised to bf16 at load, "
                        "vLLM's unquantised MoE path", "reference")
    if not is_sm12x(capability):
        return Decision(AUTO, f"compute capability {capability[0]}.{capability[1]} is not 12.x: "
                        "vLLM's own NVFP4 MoE selection", "vllm-auto")
    candidates: dict[str, str] = {}
    results: dict[str, CheckResult] = {}

    def check(name: str) -> CheckResult:
        if name not in results:
            try:
                results[name] = self_check(name) if self_check else CheckResult(True, "self-check skipped")
            except Exception as exc:  # a crashing candidate fails its check, it never stops start-up
                results[name] = CheckResult(False, f"{type(exc).__name__}: {exc}")
            r = results[name]
            candidates[name] = ("passed" if r.passed else "failed") + f": {r.detail}"
        return results[name]

    note = ""
    if setting and setting != AUTO:
        if setting not in SM12X_PREFERENCE:
            note = (f"SPARK_PLUGIN_MOE_BACKEND={setting!r} is not one of "
                    f"{', '.join(SM12X_PREFERENCE)}; ignored")
        elif available.get(setting, "not known to this vLLM") is not None:
            candidates[setting] = f"unavailable: {available.get(setting, 'not known to this vLLM')}"
            note = f"SPARK_PLUGIN_MOE_BACKEND={setting} is unavailable here; ignored"
        elif check(setting).passed:
            return Decision(setting, "SPARK_PLUGIN_MOE_BACKEND setting, self-check passed", "setting", candidates)
        else:
            note = f"SPARK_PLUGIN_MOE_BACKEND={setting} failed its self-check; ignored"
        log.warning("vllm-spark-plugin: %s", note)
    order = " > ".join(SM12X_PREFERENCE)
    for name in SM12X_PREFERENCE:
        why = available.get(name, "not known to this vLLM")
        if why is not None:
            candidates.setdefault(name, f"unavailable: {why}")
            continue
        if check(name).passed:
            reason = f"GB10 preference {order}: first available that passed the self-check"
            return Decision(name, reason + (f"; {note}" if note else ""), "policy", candidates)
    return Decision(AUTO, "no candidate available and correct here: vLLM's own selection"
                    + (f"; {note}" if note else ""), "vllm-auto", candidates)


# --------------------------------------------------------------------------------------------------
# The decision of this process, and its hand-over to the API server (info metric label)
# --------------------------------------------------------------------------------------------------
_lock = threading.Lock()
_current: Decision | None = None


def state_path() -> Path | None:
    p = os.environ.get(STATE_ENV, "")
    return Path(p) if p else None


def ensure_state_path() -> Path:
    """Called in the API-server process before vLLM spawns the engine: engine and worker
    processes inherit the variable and publish their decision there."""
    p = state_path()
    if p is None:
        folder = Path(tempfile.gettempdir()) / "vllm-spark-plugin"
        folder.mkdir(parents=True, exist_ok=True)
        p = folder / f"moe-backend-{os.getpid()}.json"
        os.environ[STATE_ENV] = str(p)
        try:
            p.unlink()
        except FileNotFoundError:
            pass
    return p


def record(decision: Decision) -> None:
    """Remember the decision in this process, log it, and publish it for the API server."""
    global _current
    with _lock:
        _current = decision
    (log.warning if decision.backend == AUTO and decision.source == "vllm-auto" and decision.candidates
     else log.info)(decision.log_line())
    p = state_path()
    if p is not None:
        try:
            tmp = p.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(asdict(decision)))
            os.replace(tmp, p)
        except OSError as exc:
            log.debug("vllm-spark-plugin: cannot publish the MoE decision to %s: %s", p, exc)


def current_decision() -> Decision | None:
    with _lock:
        if _current is not None:
            return _current
    p = state_path()
    if p is not None:
        try:
            data = json.loads(p.read_text())
            return Decision(**data)
        except (OSError, ValueError, TypeError):
            return None
    return None


def current_moe_backend() -> str:
    """The NVFP4 MoE backend label for `vllm_spark_info` ("none" until an NVFP4 MoE layer loads)."""
    d = current_decision()
    return d.backend if d is not None else NONE


def reset() -> None:
    """Forget the decision (tests)."""
    global _current
    with _lock:
        _current = None
