"""Unified-memory guard: a safe `--gpu-memory-utilization` for a GB10 (DGX Spark).

On a Spark the GPU has no memory of its own: vLLM's `gpu_memory_utilization` is a fraction of the
128 GB pool the OS, the desktop, page cache and every other process share (NVML cannot report it;
`/proc/meminfo` is the truth).  vLLM's default 0.9 claims ~108 GB whatever else is running, which can
wedge the host; published Spark recipes use 0.4-0.85.

    reserve = max(RESERVE_MIN_BYTES, RESERVE_FRACTION * MemTotal)    # OS, runtime, page cache
    safe    = floor_to_0.01((MemAvailable - reserve) / MemTotal)

A configured utilisation above `safe` is warned about at start-up (and fails `vllm-spark doctor`);
a model whose weights (file size x 1.05) plus a 2 GiB working margin exceed `MemAvailable - reserve`
does not fit at all.  CUDA's view of the device total on GB10 is the same pool (about MemTotal).
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("vllm_spark_plugin")

GIB = 1 << 30
RESERVE_MIN_BYTES = 4 * GIB
RESERVE_FRACTION = 0.05
WEIGHT_OVERHEAD = 1.05      # loader buffers, alignment
WORKING_MARGIN_BYTES = 2 * GIB  # activations, CUDA graphs, sampler


def read_meminfo(path: str | Path = "/proc/meminfo") -> dict[str, int]:
    """`/proc/meminfo` as bytes (keys as in the file, e.g. MemTotal, MemAvailable)."""
    out: dict[str, int] = {}
    for line in Path(path).read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        out[key.strip()] = value * 1024 if len(parts) > 1 and parts[1].lower() == "kb" else value
    return out


def model_size_bytes(model: str | Path | None) -> int | None:
    """Bytes of the weight files of a local checkpoint folder (None if not a local folder)."""
    if not model:
        return None
    folder = Path(model)
    if not folder.is_dir():
        return None
    files = list(folder.glob("*.safetensors")) or list(folder.glob("*.bin"))
    return sum(p.stat().st_size for p in files) if files else None


@dataclass
class MemoryAdvice:
    total_bytes: int
    available_bytes: int
    reserve_bytes: int
    safe_utilization: float
    model_bytes: int | None = None
    min_utilization: float | None = None   # what the weights alone need
    configured: float | None = None
    fits: bool = True
    ok: bool = True
    message: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def advise(total: int, available: int, model_bytes: int | None = None,
           configured: float | None = None) -> MemoryAdvice:
    if total <= 0:
        raise ValueError(f"MemTotal must be positive, got {total}")
    reserve = max(RESERVE_MIN_BYTES, int(RESERVE_FRACTION * total))
    usable = max(0, available - reserve)
    safe = math.floor(100 * usable / total) / 100
    adv = MemoryAdvice(total, available, reserve, safe, model_bytes=model_bytes, configured=configured)
    gib = lambda b: b / GIB  # noqa: E731
    notes = []
    if model_bytes is not None:
        need = int(model_bytes * WEIGHT_OVERHEAD) + WORKING_MARGIN_BYTES
        adv.min_utilization = math.ceil(100 * need / total) / 100
        if need > usable:
            adv.fits = False
            notes.append(f"the model needs about {gib(need):.1f} GiB (weights {gib(model_bytes):.1f} GiB + margin) "
                         f"but only {gib(usable):.1f} GiB is available after a {gib(reserve):.1f} GiB reserve: "
                         "stop other processes or use a smaller model")
    if configured is not None and configured > safe:
        notes.append(f"gpu_memory_utilization {configured:.2f} is above the safe {safe:.2f} "
                     f"(MemAvailable {gib(available):.1f} of {gib(total):.1f} GiB, reserve {gib(reserve):.1f} GiB): "
                     f"use --gpu-memory-utilization {safe:.2f} or lower")
    if adv.min_utilization is not None and adv.fits and adv.min_utilization > safe:
        adv.fits = False
        notes.append(f"the weights alone need utilisation {adv.min_utilization:.2f} > safe {safe:.2f}")
    adv.ok = adv.fits and not (configured is not None and configured > safe)
    adv.message = "; ".join(notes) if notes else (
        f"safe gpu_memory_utilization {safe:.2f} (MemAvailable {gib(available):.1f} of {gib(total):.1f} GiB)"
        + (f"; configured {configured:.2f} is within it" if configured is not None else ""))
    return adv


def advise_from_system(model: str | None = None, configured: float | None = None,
                       meminfo_path: str | Path = "/proc/meminfo") -> MemoryAdvice:
    info = read_meminfo(meminfo_path)
    if "MemTotal" not in info or "MemAvailable" not in info:
        raise ValueError(f"{meminfo_path}: no MemTotal/MemAvailable")
    return advise(info["MemTotal"], info["MemAvailable"], model_size_bytes(model), configured)


@dataclass
class StartupSnapshot:
    """What vLLM's start-up memory check will compare, and what the host really has (bytes).

    vLLM (`v1/worker/utils.py::request_memory`) refuses to start when the free memory CUDA reports is
    below `gpu_memory_utilization x total`.  On a unified-memory GB10 CUDA's free memory is the kernel's
    MemFree: page cache counts as used (vllm #48140; measured in unsloth #10704: cuda_free tracked
    MemFree exactly while MemAvailable did not move).
    """

    utilization: float
    total_bytes: int
    requested_bytes: int        # ceil(utilization x total): vLLM's requested memory
    mem_free_bytes: int         # what vLLM's check compares against on unified memory
    mem_available_bytes: int
    page_cache_bytes: int       # Cached + Buffers
    reclaimable_bytes: int      # page cache - Shmem + SReclaimable: what dropping caches gives back
    reserve_bytes: int          # what the OS keeps (see `advise`)
    safe_utilization: float
    vllm_check_passes: bool
    ok: bool
    message: str
    fix: str = ""
    facts: str = ""             # the figures alone, without the verdict or what vLLM compares

    def as_dict(self) -> dict:
        return asdict(self)


DROP_CACHES = "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches"


def startup_snapshot(meminfo: dict[str, int], utilization: float, total_bytes: int | None = None) -> StartupSnapshot:
    """`meminfo` as from `read_meminfo` (bytes); `total_bytes` is CUDA's device total when known
    (about MemTotal on GB10)."""
    from vllm_spark_plugin.common.memory_sources import Meminfo

    info = Meminfo(dict(meminfo))
    total = int(total_bytes or meminfo["MemTotal"])
    free, avail = meminfo["MemFree"], meminfo["MemAvailable"]
    cache = meminfo.get("Cached", 0) + meminfo.get("Buffers", 0)
    reclaimable = info.reclaimable_bytes() or 0
    adv = advise(total, avail, configured=utilization)
    requested = math.ceil(total * utilization)
    passes = free >= requested
    gib = lambda b: b / GIB  # noqa: E731
    facts = (f"requested {utilization:.2f} x {gib(total):.1f} GiB = {gib(requested):.1f} GiB; vLLM's start-up check "
             f"compares it with the free memory CUDA reports, MemFree {gib(free):.1f} GiB on unified memory; "
             f"MemAvailable {gib(avail):.1f} GiB, page cache {gib(cache):.1f} GiB ({gib(reclaimable):.1f} GiB reclaimable)")
    fixes = []
    if not passes:
        if free + reclaimable >= requested:
            fixes.append(f"drop the page cache before starting ({DROP_CACHES}): it frees about "
                         f"{gib(reclaimable):.1f} GiB, enough for the {gib(requested):.1f} GiB requested")
        if utilization > adv.safe_utilization or free + reclaimable < requested:
            fixes.append(f"use --gpu-memory-utilization {adv.safe_utilization:.2f} or lower (leaves the OS its "
                         f"{gib(adv.reserve_bytes):.1f} GiB reserve)" if adv.safe_utilization > 0
                         else "free memory: stop other processes")
        verdict = "start-up will fail"
    elif utilization > adv.safe_utilization:
        fixes.append(f"use --gpu-memory-utilization {adv.safe_utilization:.2f} or lower (leaves the OS its "
                     f"{gib(adv.reserve_bytes):.1f} GiB reserve)")
        verdict = f"start-up passes but leaves the OS {gib(max(0, avail - requested)):.1f} GiB, under its reserve"
    else:
        verdict = "start-up check passes with the OS reserve kept"
    fix = "; or ".join(fixes)
    figures = (f"requested {utilization:.2f} x {gib(total):.1f} GiB = {gib(requested):.1f} GiB; MemFree {gib(free):.1f} GiB, "
               f"MemAvailable {gib(avail):.1f} GiB, page cache {gib(cache):.1f} GiB ({gib(reclaimable):.1f} GiB reclaimable)")
    return StartupSnapshot(utilization, total, requested, free, avail, cache, reclaimable, adv.reserve_bytes,
                           adv.safe_utilization, passes, not fixes, f"{verdict}: {facts}", fix, figures)


def log_startup_snapshot(utilization: float | None, total_bytes: int | None = None,
                         meminfo_path: str | Path = "/proc/meminfo", sized_by: str | None = None,
                         where: str = "") -> StartupSnapshot | None:
    """Log the snapshot in the engine process: one info line, or one warning with the fix.

    `sized_by`: where the build does not size memory by the utilisation (vLLM's CPU build: the KV
    cache is `VLLM_CPU_KVCACHE_SPACE`), the reason; the figures are then logged as information, with
    no verdict.  `where` names the engine in the line (e.g. "engine 0")."""
    if utilization is None:
        return None
    info = read_meminfo(meminfo_path)
    if not all(k in info for k in ("MemTotal", "MemFree", "MemAvailable")):
        log.warning("vllm-spark-plugin: unified memory: %s has no MemTotal/MemFree/MemAvailable; no start-up snapshot",
                    meminfo_path)
        return None
    snap = startup_snapshot(info, utilization, total_bytes)
    head = f"vllm-spark-plugin: unified memory at start-up{f' ({where})' if where else ''}"
    if sized_by:
        log.info("%s: %s; no verdict, figures only: %s", head, sized_by, snap.facts)
    elif snap.ok:
        log.info("%s: %s", head, snap.message)
    else:
        log.warning("%s: %s. Fix: %s", head, snap.message, snap.fix)
    return snap


def check_at_startup(vllm_config, snapshot: bool = True) -> MemoryAdvice | None:
    """Warn when the configured utilisation is above the safe figure (CUDA devices only: the CPU
    build sizes its KV cache with VLLM_CPU_KVCACHE_SPACE instead).  `snapshot=False` where the
    engine-core start-up hook (`hooks.startup`) has logged the start-up snapshot already."""
    from vllm_spark_plugin.vllm import platform as _vllm

    if not _vllm.has_cuda():
        return None
    cache = getattr(vllm_config, "cache_config", None)
    configured = getattr(cache, "gpu_memory_utilization", None)
    model = getattr(getattr(vllm_config, "model_config", None), "model", None)
    adv = advise_from_system(model, configured)
    if adv.ok:
        log.info("vllm-spark-plugin: unified memory: %s", adv.message)
    else:
        log.warning("vllm-spark-plugin: unified memory: %s", adv.message)
    if snapshot:
        log_startup_snapshot(configured)
    return adv
