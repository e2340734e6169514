"""`vllm-spark doctor`: the unified-memory and silently-ignored-setting checks (a row of doctor.registry).

* memory_startup   - what vLLM's start-up check will compare (requested utilisation x total against
                     MemFree, which is CUDA's free memory on unified memory) and the fix: drop the page
                     cache, or the utilisation that leaves the OS its reserve;
* memory_headroom  - free + reclaimable memory: how much a new allocation could get;
* driver_events    - NVRM NV_ERR_NO_MEMORY and Xid lines in the kernel log since boot;
* unknown_env      - VLLM_* variables that the installed vLLM does not know (its own registry,
                     `vllm.envs.environment_variables`): vLLM ignores them without a word;
* cudagraph_sizes  - CUDA-graph capture sizes that do not cover --max-num-seqs: larger decode
                     batches run eager.

Seams: `Probe.meminfo_path`; `Probe.extra["kernel_log_path"]` (default /dev/kmsg) and
`Probe.extra["vllm_env_names"]` (a callable returning the registry's names).
"""
from __future__ import annotations

import difflib
import json
from collections.abc import Mapping

from vllm_spark_plugin.common import memory_sources as ms
from vllm_spark_plugin.quant import memory_guard

GIB = 1 << 30
HEADROOM_LOW = 0.10   # the same threshold as the VllmSparkReclaimableHeadroomLow alert
VLLM_DEFAULT_MAX_NUM_SEQS = 256   # vLLM 0.32's default --max-num-seqs on GPUs
# vLLM's own default capture sizes: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16), max 512
VLLM_DEFAULT_MAX_CAPTURE = 512


def checks(env: Mapping[str, str], serve, probe, cuda: bool) -> list:
    from vllm_spark_plugin.doctor import check as d

    out = []
    for fn in (_memory_checks, _driver_events, _unknown_env, _cudagraph_sizes):
        out += d.contained(fn.__name__.strip("_"), fn, env, serve, probe, cuda)  # one broken check hides no other
    return out


def _memory_checks(env, serve, probe, cuda) -> list:
    from vllm_spark_plugin.doctor import check as d

    try:
        with open(probe.meminfo_path, encoding="ascii", errors="replace") as fh:
            info = ms.parse_meminfo(fh.read())
    except OSError as exc:
        return [d.Check("memory_headroom", d.WARN, f"cannot read {probe.meminfo_path}: {exc.strerror or exc}")]
    if not info.complete:
        return [d.Check("memory_headroom", d.WARN, f"{probe.meminfo_path} lacks MemTotal/MemFree/MemAvailable")]
    v = info.values
    total, headroom, rec = v["MemTotal"], info.headroom_bytes() or v["MemFree"], info.reclaimable_bytes() or 0
    share = headroom / total
    detail = (f"MemFree {v['MemFree'] / GIB:.1f} GiB + reclaimable {rec / GIB:.1f} GiB (page cache less Shmem, "
              f"reclaimable slab) = {headroom / GIB:.1f} GiB, {share:.0%} of {total / GIB:.1f} GiB; "
              f"MemAvailable {v['MemAvailable'] / GIB:.1f} GiB")
    out = [d.Check("memory_headroom", d.OK, detail) if share >= HEADROOM_LOW else
           d.Check("memory_headroom", d.FAIL, detail + f": under {HEADROOM_LOW:.0%}, the driver can fail allocations "
                   "(NV_ERR_NO_MEMORY) and the host can wedge", "stop other processes or serve a smaller model / "
                   "lower --gpu-memory-utilization")]

    util = serve.gpu_memory_utilization
    if util is None and not cuda:
        out.append(d.Check("memory_startup", d.NA if hasattr(d, "NA") else d.INFO,
                           "CPU build: vLLM's start-up memory check compares gpu_memory_utilization on GPUs only "
                           "(pass --gpu-memory-utilization X to evaluate one)"))
        return out
    util = d.VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if util is None else util
    snap = memory_guard.startup_snapshot(v, util)
    if snap.ok:
        out.append(d.Check("memory_startup", d.OK, snap.message))
    else:
        out.append(d.Check("memory_startup", d.FAIL if not snap.vllm_check_passes else d.WARN, snap.message, snap.fix))
    return out


def _driver_events(env, serve, probe, cuda) -> list:
    from vllm_spark_plugin.doctor import check as d

    path = probe.extra.get("kernel_log_path", ms.KMSG_PATH)
    reader = ms.KmsgReader(path, from_start=True)
    try:
        reader.open()
        found = reader.read_new()
    except OSError as exc:
        return [d.Check("driver_events", d.INFO, f"cannot read the kernel log {path}: {exc.strerror or exc}",
                        "run doctor as root, or look yourself: sudo dmesg | grep -E 'NV_ERR_NO_MEMORY|NVRM: Xid'")]
    finally:
        reader.close()
    n_oom, xids = found.events[ms.NV_ERR_NO_MEMORY], found.xids
    if not n_oom and not xids:
        return [d.Check("driver_events", d.OK, f"no NVRM NV_ERR_NO_MEMORY or Xid line in the kernel log "
                        f"({found.records} records read from {path})")]
    parts = []
    if n_oom:
        parts.append(f"{n_oom} NV_ERR_NO_MEMORY line(s)")
    if xids:
        parts.append("Xid " + ", ".join(f"{x} x{n}" for x, n in sorted(xids.items())))
    return [d.Check("driver_events", d.WARN, "the NVIDIA driver logged " + "; ".join(parts) + " since boot "
                    f"({found.records} records in {path})",
                    "see alerts/runbooks/VllmSparkDriverOutOfMemory.md: lower --gpu-memory-utilization, drop the page "
                    "cache before start-up, keep prefills shorter (--max-num-batched-tokens)" if n_oom else
                    "look up each Xid in NVIDIA's Xid catalogue; repeated Xids on one GPU need a driver/firmware check")]


def vllm_env_names() -> set[str]:
    from vllm_spark_plugin.vllm.platform import environment_variable_names
    return environment_variable_names()


def _unknown_env(env, serve, probe, cuda) -> list:
    from vllm_spark_plugin.doctor import check as d

    names = probe.extra.get("vllm_env_names", vllm_env_names)
    try:
        known = set(names())
    except Exception as exc:
        return [d.Check("unknown_env", d.INFO, f"vLLM's registry of variables could not be read ({type(exc).__name__})")]
    stale = set(getattr(d, "STALE_ENV", ()))   # reported with their replacements by the stale_env check
    unknown = sorted(n for n in env if n.startswith("VLLM_") and n not in known and n not in stale)
    if not unknown:
        return [d.Check("unknown_env", d.OK, f"every VLLM_* variable set is one the installed vLLM reads "
                        f"({len(known)} in its registry)")]
    out = []
    for n in unknown:
        near = difflib.get_close_matches(n, known, n=1, cutoff=0.8)
        out.append(d.Check(f"env:{n}", d.WARN, f"{n} is set but the installed vLLM does not know it "
                           "(not in vllm.envs): it is silently ignored",
                           f"unset {n}" + (f", or did you mean {near[0]}?" if near else "")))
    return out


def _int_flag(argv: list[str], flag: str) -> int | None:
    for i, a in enumerate(argv):
        key, eq, val = a.partition("=")
        if key == flag:
            val = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                return int(val)
            except ValueError:
                raise ValueError(f"{flag} {val!r} is not an integer") from None
    return None


def _compilation_config(argv: list[str]) -> dict:
    """`--compilation-config JSON`, `-cc JSON`, `-cc.key=value`, `--compilation-config.key value`."""
    cfg: dict = {}
    for i, a in enumerate(argv):
        key, eq, val = a.partition("=")
        for prefix in ("--compilation-config", "-cc"):
            if key == prefix:
                text = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
                try:
                    got = json.loads(text)
                except json.JSONDecodeError:
                    got = None
                if isinstance(got, dict):
                    cfg.update(got)
            elif key.startswith(prefix + "."):
                sub = key[len(prefix) + 1:]
                text = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
                try:
                    cfg[sub] = json.loads(text)
                except json.JSONDecodeError:
                    cfg[sub] = text
    return cfg


def _cudagraph_sizes(env, serve, probe, cuda) -> list:
    from vllm_spark_plugin.doctor import check as d

    argv = list(getattr(serve, "argv", None) or [])
    if not cuda:
        return [d.Check("cudagraph_sizes", d.NA if hasattr(d, "NA") else d.INFO,
                        "no CUDA device: CUDA-graph capture sizes apply on the GPU")]
    if getattr(serve, "enforce_eager", False):
        return []  # the cuda_graphs check already says CUDA graphs are off
    seqs = _int_flag(argv, "--max-num-seqs")
    cfg = _compilation_config(argv)
    sizes = cfg.get("cudagraph_capture_sizes")
    max_size = cfg.get("max_cudagraph_capture_size")
    if isinstance(sizes, list) and sizes and all(isinstance(s, int) for s in sizes):
        cover, source = max(sizes), f"cudagraph_capture_sizes {sorted(sizes)}"
    elif isinstance(max_size, int):
        cover, source = max_size, f"max_cudagraph_capture_size {max_size}"
    else:
        cover, source = VLLM_DEFAULT_MAX_CAPTURE, f"vLLM's default capture sizes (up to {VLLM_DEFAULT_MAX_CAPTURE})"
    seqs_text = f"--max-num-seqs {seqs}" if seqs is not None else f"vLLM's default --max-num-seqs {VLLM_DEFAULT_MAX_NUM_SEQS}"
    seqs = VLLM_DEFAULT_MAX_NUM_SEQS if seqs is None else seqs
    if cover >= seqs:
        return [d.Check("cudagraph_sizes", d.OK, f"{source} cover {seqs_text}")]
    return [d.Check("cudagraph_sizes", d.WARN, f"{source} stop at {cover} but {seqs_text}: decode batches of "
                    f"{cover + 1}-{seqs} requests run without CUDA graphs (eager, much slower on GB10)",
                    f"add capture sizes up to {seqs} (e.g. -cc.max_cudagraph_capture_size={seqs}), "
                    f"or pass --max-num-seqs {cover}")]
