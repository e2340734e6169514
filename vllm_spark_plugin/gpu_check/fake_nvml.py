"""The dry run's NVML: a stand-in for the `pynvml` module at the seam `metrics.hardware.NvmlSampler`
already has (the module object it is handed), answering only the calls the sampler and the checks
make.  One GPU with two states, idle and loaded (`set_load`, called by the dry burn):

* power is a step profile (idle_w / load_w); the total-energy counter (mJ) is its exact integral,
  times `energy_scale` (1 = consistent; anything else makes a counter the energy check must catch),
  updated every `counter_period` seconds (0: continuously; some GPUs update theirs coarsely);
* SM clock, temperature, utilisation and clock-event reasons follow the state;
* memory: a ledger that `allocate` / `release` move (what the dry run's "GPU allocation" is), or
  NOT_SUPPORTED with `memory_supported=False`, as GB10's unified memory answers.
"""
from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's class name, which the sampler matches
    pass


MiB = 1 << 20
GPU_IDLE, SW_POWER_CAP = 0x1, 0x4  # nvml.h clock-event reason bits


class FakeNvml:
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, clock: Callable[[], float] = time.monotonic, idle_w: float = 60.0, load_w: float = 300.0,
                 energy_scale: float = 1.0, counter_period: float = 0.0, total_bytes: int = 96 << 30,
                 memory_supported: bool = True, name: str = "Fake GPU (dry run)") -> None:
        self.clock = clock
        self.idle_w, self.load_w = idle_w, load_w
        self.energy_scale = energy_scale
        self.counter_period = counter_period
        self.total_bytes = total_bytes
        self.memory_supported = memory_supported
        self.name = name
        self.loaded = False
        self.used_bytes = 512 * MiB  # the context and the driver's own
        self._lock = threading.Lock()
        self._t = clock()
        self._energy_mj = 1.0e9  # "since driver load": a large start value, as on a real GPU
        self._shown_mj, self._next_update = self._energy_mj, self._t

    # -- the dry run drives it --------------------------------------------------------------------
    def power_w(self) -> float:
        return self.load_w if self.loaded else self.idle_w

    def _advance(self) -> None:
        now = self.clock()
        self._energy_mj += self.power_w() * (now - self._t) * 1000.0 * self.energy_scale
        self._t = now

    def set_load(self, on: bool) -> None:
        with self._lock:
            self._advance()
            self.loaded = bool(on)

    def allocate(self, nbytes: int) -> None:
        self.used_bytes += int(nbytes)

    def release(self, nbytes: int) -> None:
        self.used_bytes -= int(nbytes)

    def smi_csv(self) -> str:
        """What `nvidia-smi --query-gpu=<telemetry.SMI_FIELDS> --format=csv,noheader,nounits` prints."""
        mem = (f"{self.total_bytes // MiB}, {self.used_bytes // MiB}" if self.memory_supported
               else "[N/A], [N/A]")
        return (f"{self.name}, {self.nvmlSystemGetDriverVersion()}, {self.power_w():.2f}, "
                f"{self.nvmlDeviceGetClockInfo(0, 1)}, {self.nvmlDeviceGetTemperature(0, 0)}, "
                f"{self.nvmlDeviceGetUtilizationRates(0).gpu}, {mem}\n")

    # -- the pynvml calls -------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i != 0:
            raise NVMLError(f"no GPU {i}")
        return 0

    def nvmlDeviceGetName(self, h) -> str:
        return self.name

    def nvmlDeviceGetUUID(self, h) -> str:
        return "GPU-00000000-0000-0000-0000-000000000000"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "0.0 (fake)"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 0

    def nvmlDeviceGetPowerUsage(self, h) -> int:
        return int(round(self.power_w() * 1000.0))

    def nvmlDeviceGetTotalEnergyConsumption(self, h) -> int:
        with self._lock:
            self._advance()
            if self._t >= self._next_update:
                self._shown_mj, self._next_update = self._energy_mj, self._t + self.counter_period
            return int(self._shown_mj)

    def nvmlDeviceGetClockInfo(self, h, kind) -> int:
        return 1980 if self.loaded else 345

    def nvmlDeviceGetTemperature(self, h, sensor) -> int:
        return 62 if self.loaded else 34

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=100 if self.loaded else 0, memory=40 if self.loaded else 0)

    def nvmlDeviceGetMemoryInfo(self, h):
        if not self.memory_supported:
            raise NVMLError_NotSupported()
        return types.SimpleNamespace(total=self.total_bytes, used=self.used_bytes,
                                     free=self.total_bytes - self.used_bytes)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h) -> int:
        return 0 if self.loaded else GPU_IDLE
