"""The ordered checks and the command line:

    python -m vllm_spark_plugin.gpu_check OUTDIR [--dry]     (scripts/gpu-check.sh OUTDIR [--dry])

Each check runs contained: an exception is its "fail" (with the exception and where it was raised)
and the next check runs; `NotApplicable` is its "n/a".  A check not started within the time budget
fails as not run.  Exit codes: `report` (0 none failed, 1 one failed or the run stopped early,
2 usage).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from vllm_spark_plugin.gpu_check import env as env_mod
from vllm_spark_plugin.gpu_check import moe, nvfp4, render, telemetry
from vllm_spark_plugin.gpu_check.report import FAIL, NA, NotApplicable, Report, Result, Verdict, verdict

HEAVY_MODULES = ("torch", "vllm", "triton", "transformers")


def check_import_weight(env) -> Verdict:
    """Importing the plugin (what vLLM does in every process) and this package pulls in nothing heavy."""
    code = ("import json, sys, vllm_spark_plugin, vllm_spark_plugin.gpu_check.run; "
            f"print(json.dumps(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)))")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        return verdict(False, f"import failed: {out.stderr.strip().splitlines()[-1:]}")
    heavy = json.loads(out.stdout.strip().splitlines()[-1])
    return verdict(not heavy, f"import vllm_spark_plugin and its gpu_check package: "
                   + (f"imported {', '.join(heavy)}" if heavy else f"none of {', '.join(HEAVY_MODULES)} imported")
                   + f" ({seconds:.2f} s in a fresh interpreter)", heavy=heavy, seconds=round(seconds, 2))


def check_device(env) -> Verdict:
    """The CUDA device and the NVML device the checks read are the same GPU."""
    if env.dry:
        return verdict(True, "dry run: CPU tensors and the NVML fake (gpu_check.fake_nvml); nothing ran on a GPU")
    m = env.machine()
    same = m["cuda_device_name"] == m["gpu_name"]
    return verdict(same, f"CUDA device 0 {m['cuda_device_name']!r} (compute capability {m['compute_capability']}) is "
                   f"NVML device {env.nvml_index} {m['gpu_name']!r}" + ("" if same else ": different GPUs"),
                   nvml_index=env.nvml_index)


CHECKS: tuple[tuple[str, Callable], ...] = (
    ("import_weight", check_import_weight),
    ("device", check_device),
    ("nvfp4_roundtrip", nvfp4.check_roundtrip),
    ("nvfp4_gemm", nvfp4.check_gemm),
    ("moe_selfcheck", moe.check_selfcheck),
    ("moe_timing", moe.check_timing),
    ("moe_tune_smem", moe.check_tune_smem),
    ("moe_policy", moe.check_policy),
    ("gb10_kernels", moe.check_gb10_kernels),
    ("nvml_memory", telemetry.check_memory),
    ("nvml_energy", telemetry.check_energy),
    ("nvml_gauges", telemetry.check_gauges),
    ("nvidia_smi", telemetry.check_nvidia_smi),
    ("exporter_render", render.check_render),
)
CHECK_NAMES = tuple(name for name, _ in CHECKS)


def _contained(name: str, fn: Callable, env, dry: bool) -> Result:
    t0 = time.perf_counter()
    try:
        v = fn(env)
        status, detail, figures = v.status, v.detail, v.figures
    except NotApplicable as exc:
        status, detail, figures = NA, f"not applicable here: {exc}", {}
    except Exception as exc:
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        status, detail, figures = FAIL, f"crashed: {type(exc).__name__}: {exc}", {"traceback": tb[-6:]}
    return Result(name, status, detail, figures, round(time.perf_counter() - t0, 2), dry)


def run(out_dir: str | Path, dry: bool = False, env=None) -> int:
    """Run every check into `out_dir`; `env` overrides the environment (a dry run on another fake)."""
    say = env_mod.say
    setup_error = None
    if env is None:
        try:
            env = env_mod.make_env(dry)
        except Exception as exc:
            setup_error = f"{type(exc).__name__}: {exc}"
    mode = "dry" if dry or (env is not None and env.dry) else "gpu"
    try:
        machine = env.machine() if env is not None else {"error": setup_error}
    except Exception as exc:
        machine = {"error": f"{type(exc).__name__}: {exc}"}
    report = Report(out_dir, mode, machine)
    budget = (env.timing if env is not None else env_mod.GPU_TIMING).budget_seconds
    say(f"{mode} run into {out_dir}: {len(CHECKS)} checks, budget {budget:.0f} s")
    t_start = time.monotonic()
    for i, (name, fn) in enumerate(CHECKS, 1):
        say(f"[{i}/{len(CHECKS)}] {name} ...")
        if time.monotonic() - t_start > budget:
            r = Result(name, FAIL, f"not run: the run's time budget of {budget:.0f} s was spent", dry=mode == "dry")
        elif env is None and name != "import_weight":
            r = Result(name, FAIL, f"no environment to check: {setup_error}", dry=mode == "dry")
        else:
            r = _contained(name, fn, env, mode == "dry")
        report.add(r)
        say(f"[{r.status}] {name}: {r.detail} ({r.seconds:.1f} s)")
    code = report.finish()
    print(report.to_text(), end="", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu-check", description="Check the plugin's GPU side on this machine's GPU "
                                "(docs/gpu-check.md).")
    p.add_argument("out_dir", help="folder for gpu-check.json and gpu-check.txt (created)")
    p.add_argument("--dry", action="store_true", help="CPU tensors and an NVML fake instead of the GPU (seconds)")
    args = p.parse_args(argv)
    return run(Path(args.out_dir), dry=args.dry)
