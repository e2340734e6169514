"""Hardware telemetry, sampled off vLLM's hot path: NVML (GPU); /proc (unified memory, PSI, the kernel
log) is read by `memory_telemetry.py`.

On GB10 NVML's memory queries return NOT_SUPPORTED (the memory is unified), so memory comes from
/proc/meminfo and /proc/pressure/memory.  Without a driver `nvmlInit` fails and the GPU series are
simply absent: that is not an error.  A reading that fails for any other reason is counted and
logged once, and sampling goes on.
"""
from __future__ import annotations

import logging

from vllm_spark_plugin.common import errors

log = logging.getLogger("vllm_spark_plugin")


# NVML clock-event (throttle) reason bits, named as in nvml.h.
CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


class NvmlSampler:
    """Reads each GPU once per call.  `nvml` is the pynvml module (a fake in tests: the seam)."""

    def __init__(self, nvml=None) -> None:
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        self.nvml = nvml
        self.handles: list = []
        self.available = False
        self._energy_base: dict[int, float] = {}
        self._unsupported: set[tuple[int, str]] = set()

    def init(self) -> bool:
        try:
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.available = bool(self.handles)
        except Exception as exc:
            # No driver / no library / no device: GPU series are absent, nothing to count.
            if type(exc).__name__ not in ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded",
                                          "NVMLError_NoPermission", "NVMLError_Uninitialized"):
                errors.report("nvml_init", exc)
            self.available = False
            log.info("vllm-spark-plugin: NVML not available (%s); GPU telemetry off", type(exc).__name__)
        return self.available

    def _read(self, idx: int, what: str, fn, *args):
        if (idx, what) in self._unsupported:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            if type(exc).__name__ == "NVMLError_NotSupported":
                self._unsupported.add((idx, what))  # e.g. memory info on GB10: expected, silent
            else:
                errors.report("nvml_" + what, exc)
            return None

    def sample(self) -> list[dict]:
        """One dict per GPU: power_w, energy_delta_j, sm_clock_hz, temperature_c, utilization, reasons."""
        out = []
        nv = self.nvml
        for idx, h in enumerate(self.handles):
            r: dict = {"gpu": str(idx)}
            mw = self._read(idx, "power", nv.nvmlDeviceGetPowerUsage, h)
            if mw is not None:
                r["power_w"] = mw / 1000.0
            mj = self._read(idx, "energy", nv.nvmlDeviceGetTotalEnergyConsumption, h)
            if mj is not None:
                base = self._energy_base.get(idx)
                self._energy_base[idx] = mj
                # Energy is "since driver load": export deltas; a counter reset (driver reload) is skipped.
                r["energy_delta_j"] = 0.0 if base is None or mj < base else (mj - base) / 1000.0
            mhz = self._read(idx, "clock", nv.nvmlDeviceGetClockInfo, h, getattr(nv, "NVML_CLOCK_SM", 1))
            if mhz is not None:
                r["sm_clock_hz"] = mhz * 1e6
            t = self._read(idx, "temperature", nv.nvmlDeviceGetTemperature, h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            if t is not None:
                r["temperature_c"] = float(t)
            u = self._read(idx, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
            if u is not None:
                r["utilization"] = getattr(u, "gpu", 0) / 100.0
            mem_fn = getattr(nv, "nvmlDeviceGetMemoryInfo", None)
            mem = self._read(idx, "memory", mem_fn, h) if mem_fn else None  # NOT_SUPPORTED on GB10
            if mem is not None:
                r["memory"] = {k: int(getattr(mem, k)) for k in ("total", "free", "used") if hasattr(mem, k)}
            fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            bits = self._read(idx, "clock_events", fn, h) if fn else None
            if bits is not None:
                r["reasons"] = {name: int(bool(bits & mask)) for name, mask in CLOCK_EVENT_REASONS.items()}
            out.append(r)
        return out
