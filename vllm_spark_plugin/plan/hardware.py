"""Hardware profiles: built-in (`gb10`, `h100`, `h200`, packaged JSON under `plan/profiles/`) or a
custom JSON file with the same fields.

Required fields: name, memory_bytes, bandwidth_nominal_bytes_per_second,
compute_flops_per_second (a mapping dtype -> FLOP/s with at least "bf16").  Optional (defaults in
`_DEFAULTS`): bandwidth_measured_bytes_per_second, unified_memory, os_reserve_bytes,
gpu_memory_utilization, kernel_overhead_seconds, step_overhead_seconds, runtime_base_bytes,
interconnect {bandwidth_bytes_per_second, latency_seconds, small_message_bandwidth_bytes_per_second,
small_message_limit_bytes}, description, notes, sources.  A measured link rate (`vllm-spark plan
--link-rate`, plan/links.py) is not a profile field: `Hardware.with_link_rate` caps the profile's link with it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

_DEFAULTS = {
    "unified_memory": False,
    "os_reserve_bytes": 0.0,
    "gpu_memory_utilization": 0.9,
    "kernel_overhead_seconds": 10e-6,
    "step_overhead_seconds": 1e-3,
    "runtime_base_bytes": 2 * 2**30,
    "interconnect": {"name": "", "bandwidth_bytes_per_second": 25e9, "latency_seconds": 5e-6,
                     "small_message_bandwidth_bytes_per_second": None, "small_message_limit_bytes": 1 << 20},
}


class HardwareError(ValueError):
    pass


@dataclass
class Hardware:
    name: str
    memory_bytes: float
    bandwidth_nominal: float
    compute: dict
    bandwidth_measured: float | None = None
    unified_memory: bool = False
    os_reserve_bytes: float = 0.0
    gpu_memory_utilization: float = 0.9
    kernel_overhead_seconds: float = 10e-6
    step_overhead_seconds: float = 1e-3
    runtime_base_bytes: float = 2 * 2**30
    link_bandwidth: float = 25e9
    link_latency: float = 5e-6
    link_name: str = ""
    link_small_bandwidth: float | None = None  # slope of the measured small-message collective time
    link_small_limit: float = float(1 << 20)
    link_measured: float | None = None     # bytes/s the slowest link carries (plan --link-rate), None: as profiled
    link_measured_source: str = ""
    description: str = ""
    notes: str = ""
    sources: list = field(default_factory=list)

    def peak(self, dtype: str) -> tuple[str, float]:
        """(dtype actually used, FLOP/s): formats the profile has no peak for fall back to bf16."""
        if dtype in self.compute:
            return dtype, float(self.compute[dtype])
        return "bf16", float(self.compute["bf16"])

    def collective_seconds(self, nbytes: float, ring: float = 1.0) -> float:
        """Time of one collective (all-reduce, all-to-all or hop) carrying `nbytes` per rank.

        Decode messages are small (kilobytes to about a megabyte): there the measured time is a line,
        latency + bytes / small-message bandwidth (NCCL's latency protocols, far below the wire rate);
        above `small_message_limit_bytes` the rest moves at the large-message bus bandwidth (x the
        ring factor 2(n-1)/n of an all-reduce).  Without a small-message slope: latency + ring x bytes / bw.

        A measured link rate caps the byte terms: no collective moves its ring x bytes per rank faster than
        the slowest link carries them, so the large-message bandwidth becomes min(profile, measured) and the
        small-message part at least ring x bytes / measured.  The latency stays; where the profile's
        figures (measured on healthy links) are slower than the measured rate, they stand.
        """
        if nbytes <= 0:
            return 0.0
        cap = self.link_measured
        big_bw = self.link_bandwidth if cap is None else min(self.link_bandwidth, cap)
        if self.link_small_bandwidth is None:
            return self.link_latency + ring * nbytes / big_bw
        small = min(nbytes, self.link_small_limit)
        small_seconds = small / self.link_small_bandwidth
        if cap is not None:
            small_seconds = max(small_seconds, ring * small / cap)
        return self.link_latency + small_seconds + ring * max(0.0, nbytes - small) / big_bw

    def with_link_rate(self, bytes_per_second: float | None, source: str = "") -> "Hardware":
        """This profile with its link capped at a measured rate (None: the profile's own link)."""
        return replace(self, link_measured=bytes_per_second, link_measured_source=source if bytes_per_second else "")

    def to_dict(self) -> dict:
        return {
            "name": self.name, "description": self.description, "memory_bytes": self.memory_bytes,
            "unified_memory": self.unified_memory, "os_reserve_bytes": self.os_reserve_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "bandwidth_nominal_bytes_per_second": self.bandwidth_nominal,
            "bandwidth_measured_bytes_per_second": self.bandwidth_measured,
            "compute_flops_per_second": dict(self.compute),
            "kernel_overhead_seconds": self.kernel_overhead_seconds,
            "step_overhead_seconds": self.step_overhead_seconds,
            "runtime_base_bytes": self.runtime_base_bytes,
            "interconnect": {"name": self.link_name, "bandwidth_bytes_per_second": self.link_bandwidth,
                             "latency_seconds": self.link_latency,
                             "small_message_bandwidth_bytes_per_second": self.link_small_bandwidth,
                             "small_message_limit_bytes": self.link_small_limit,
                             "measured_rate_bytes_per_second": self.link_measured,
                             "measured_rate_source": self.link_measured_source or None},
        }


def _positive(doc: dict, key: str, where: str, allow_zero: bool = False) -> float:
    v = doc.get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
    if not ok:
        raise HardwareError(f"{where}: field {key!r} must be a {'non-negative' if allow_zero else 'positive'} number, got {v!r}")
    return float(v)


def from_dict(doc: dict, where: str = "hardware profile") -> Hardware:
    if not isinstance(doc, dict):
        raise HardwareError(f"{where}: expected a JSON object")
    d = {**_DEFAULTS, **doc}
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise HardwareError(f"{where}: field 'name' must be a non-empty string")
    compute = d.get("compute_flops_per_second")
    if not isinstance(compute, dict) or "bf16" not in compute:
        raise HardwareError(f"{where}: field 'compute_flops_per_second' must map dtypes to FLOP/s and include 'bf16'")
    for k in compute:
        _positive(compute, k, f"{where}: compute_flops_per_second")
    util = _positive(d, "gpu_memory_utilization", where)
    if util > 1:
        raise HardwareError(f"{where}: gpu_memory_utilization must be in (0, 1], got {util}")
    link = d.get("interconnect") or {}
    if not isinstance(link, dict):
        raise HardwareError(f"{where}: field 'interconnect' must be an object")
    link = {**_DEFAULTS["interconnect"], **link}
    measured = d.get("bandwidth_measured_bytes_per_second")
    return Hardware(
        name=name,
        memory_bytes=_positive(d, "memory_bytes", where),
        bandwidth_nominal=_positive(d, "bandwidth_nominal_bytes_per_second", where),
        bandwidth_measured=None if measured is None else _positive(d, "bandwidth_measured_bytes_per_second", where),
        compute={k: float(v) for k, v in compute.items()},
        unified_memory=bool(d.get("unified_memory")),
        os_reserve_bytes=_positive(d, "os_reserve_bytes", where, allow_zero=True),
        gpu_memory_utilization=util,
        kernel_overhead_seconds=_positive(d, "kernel_overhead_seconds", where, allow_zero=True),
        step_overhead_seconds=_positive(d, "step_overhead_seconds", where, allow_zero=True),
        runtime_base_bytes=_positive(d, "runtime_base_bytes", where, allow_zero=True),
        link_bandwidth=_positive(link, "bandwidth_bytes_per_second", f"{where}: interconnect"),
        link_latency=_positive(link, "latency_seconds", f"{where}: interconnect", allow_zero=True),
        link_name=str(link.get("name", "")),
        link_small_bandwidth=(None if link.get("small_message_bandwidth_bytes_per_second") is None else
                              _positive(link, "small_message_bandwidth_bytes_per_second", f"{where}: interconnect")),
        link_small_limit=_positive(link, "small_message_limit_bytes", f"{where}: interconnect"),
        description=str(d.get("description", "")),
        notes=str(d.get("notes", "")),
        sources=list(d.get("sources", [])),
    )


def builtin_profiles() -> dict[str, dict]:
    root = resources.files("vllm_spark_plugin.plan") / "profiles"
    out = {}
    for entry in root.iterdir():
        if entry.name.endswith(".json"):
            doc = json.loads(entry.read_text(encoding="utf-8"))
            out[doc["name"]] = doc
    return dict(sorted(out.items()))


def load_hardware(spec: str) -> Hardware:
    """A built-in profile name or a path to a custom JSON profile."""
    profiles = builtin_profiles()
    if spec.lower() in profiles:
        return from_dict(profiles[spec.lower()], where=f"built-in profile {spec.lower()}")
    path = Path(spec).expanduser()
    if not path.exists():
        raise HardwareError(f"unknown hardware {spec!r}: not a built-in profile ({', '.join(profiles)}) and no such file")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise HardwareError(f"{path}: not valid JSON ({exc})") from None
    return from_dict(doc, where=str(path))
