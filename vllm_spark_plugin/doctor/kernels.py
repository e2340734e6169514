"""`vllm-spark doctor`: FP4 kernels whose CUDA payload does not match the device (a row of
doctor.registry).

* fp4_kernel_payload - which GPU targets the FP4 kernels compiled into the installed vLLM carry
                       (its `_C`, `_moe_C` and other extensions, and FlashInfer's libraries where it
                       ships any), read from each library's `.nv_fatbin` (`doctor.fatbin`),
                       against the device's compute capability: a wheel whose FP4 kernels exist only
                       for `sm_100a` (or `sm_120a`) has none that loads on GB10's 12.1.

Seams: `Probe.extra["sm"]` (a `(major, minor)` to check against instead of the device; the
`--sm 12.1` flag sets it) and `Probe.extra["kernel_libraries"]` (a callable returning the library
paths; default: `vllm.platform.compiled_libraries`).
"""
from __future__ import annotations

from pathlib import Path

from vllm_spark_plugin.doctor import fatbin
from vllm_spark_plugin.doctor.check import FAIL, NA, OK, WARN, Check

NAME = "fp4_kernel_payload"
FIX = ("install a vLLM build whose FP4 kernels cover {sm}: the CUDA 13 wheels compile them for sm_100f/sm_120f "
       "(the 12.x family, GB10 included); a source build with CUDA 12.8/12.9 needs 12.1a in TORCH_CUDA_ARCH_LIST. "
       "Until then serve NVFP4 MoE models with --moe-backend marlin (weight-only FP4, no FP4 tensor cores)")


def parse_sm(text: str) -> tuple[int, int]:
    """'12.1', '121', 'sm_121' or 'sm_121a' -> (12, 1)."""
    t = text.strip().lower().removeprefix("sm_").removeprefix("sm").rstrip("af")
    if "." in t:
        major, _, minor = t.partition(".")
    elif t.isdigit() and len(t) >= 2:
        major, minor = t[:-1], t[-1]
    else:
        raise ValueError(f"--sm {text!r}: expected a compute capability such as 12.1 or sm_121")
    try:
        return int(major), int(minor)
    except ValueError:
        raise ValueError(f"--sm {text!r}: expected a compute capability such as 12.1 or sm_121") from None


def _libraries(probe) -> list[str]:
    found = probe.extra.get("kernel_libraries")
    if found is None:
        from vllm_spark_plugin.vllm.platform import compiled_libraries
        found = compiled_libraries
    return list(found())


def _targets_text(payloads) -> str:
    return "; ".join(f"{Path(p.path).name}: {', '.join(f'{t} ({n})' for t, n in sorted(p.fp4_targets.items()))}"
                     for p in payloads)


def check(probe, cuda: bool) -> Check:
    sm = probe.extra.get("sm")
    if sm is None and cuda:
        sm = probe.capability()
    payloads = [fatbin.read_library(p) for p in _libraries(probe)]
    compiled = [p for p in payloads if p.has_device_code]
    if not compiled:
        return Check(NAME, NA, "the installed vLLM ships no compiled CUDA kernels (not a CUDA build)")
    fp4 = [p for p in compiled if p.fp4_targets]
    unread = [Path(p.path).name for p in compiled if not p.kernels_known]
    if sm is None:
        return Check(NAME, NA, "no CUDA device to compare with (pass --sm 12.1 to check for a GB10); FP4 kernels "
                     f"found: {_targets_text(fp4) or 'none'}")
    sm = tuple(int(x) for x in sm)
    want = fatbin.sm_text(sm)
    if sm < (10, 0):
        return Check(NAME, NA, f"{want} has no FP4 tensor cores: vLLM runs NVFP4 checkpoints there through Marlin "
                     "or emulation, not through FP4 kernels")
    if not fp4 and unread:
        return Check(NAME, WARN, f"cannot tell which kernels {', '.join(unread)} hold: their payloads are "
                     "zstd-compressed and no zstd library is available here",
                     "install libzstd (or the zstandard package)")
    covering = {Path(p.path).name: sorted({e.target for e in p.fp4_entries if e.runs_on(sm)}) for p in fp4}
    covering = {lib: targets for lib, targets in covering.items() if targets}
    if covering:
        return Check(NAME, OK, f"FP4 kernels that load on {want}: "
                     + "; ".join(f"{lib} ({', '.join(t)})" for lib, t in covering.items())
                     + f". All FP4 payloads: {_targets_text(fp4)}")
    if not fp4:
        detail = (f"the installed vLLM's compiled libraries hold no FP4 kernel for any GPU "
                  f"({len(compiled)} libraries with CUDA code read)")
    else:
        detail = (f"no FP4 kernel payload loads on {want}: FP4 kernels exist only as {_targets_text(fp4)} "
                  "(an `a` target loads on that exact SM only; plain and `f` targets on later minors of the same "
                  "major): NVFP4 GEMM and MoE kernels fail with 'no kernel image is available' or are not offered")
    return Check(NAME, FAIL, detail, FIX.format(sm=want))
