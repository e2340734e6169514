"""`vllm-spark doctor`'s fp4_kernel_payload check on vLLM's real CUDA libraries: the 0.34.0 CUDA wheel's
environment (scripts/release-env.sh 0.34.0, also the release window's newest) is read from disk, so this
runs on a machine without a GPU.  0.34.0's libraries are 0.33.0's less `_qutlass_C` (FP4 for sm_100f
only); the `_C` extension these checks read carries the same targets.
Its FP4 kernels are compiled for sm_100f and sm_120f (CUDA 13 build: vLLM's FP4_ARCHS "10.0f;11.0f;12.0f"),
so a GB10 (12.1) is covered; a library whose FP4 kernels exist only for sm_100a, seeded through the
`kernel_libraries` seam, is not.  The CLI runs for real with `--json`, in the main environment (CPU build:
n/a) and in the 0.34.0 environment with `--sm 12.1`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from support import fatbin_image as img
from vllm_spark_plugin.doctor import check as checks, fatbin, kernels as doctor_kernels

ROOT = Path(__file__).resolve().parents[2]
RELEASES = Path(os.environ.get("SPARK_RELEASES_DIR")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-spark" / "releases")
ENV_034 = RELEASES / "vllm-0.34.0"
@pytest.fixture
def env_034():
    """The 0.34.0 CUDA build's environment, made by scripts/test.sh before the tiers."""
    assert (ENV_034 / "bin" / "python").exists(), (
        f"no vLLM 0.34.0 environment at {ENV_034}: bash scripts/release-env.sh 0.34.0 cuda")
    return ENV_034


needs_034 = pytest.mark.usefixtures("env_034")
GB10 = (12, 1)


def vllm_034_libraries() -> list[Path]:
    (site,) = ENV_034.glob("lib/python3*/site-packages")
    return sorted((site / "vllm").rglob("*.so"))


def probe(paths, sm=GB10):
    return types.SimpleNamespace(extra={"kernel_libraries": lambda: [str(p) for p in paths], "sm": sm},
                                 capability=lambda: None)


@needs_034
def test_the_real_C_extension_carries_fp4_kernels_for_the_blackwell_families():
    (c,) = [p for p in vllm_034_libraries() if p.parent.name == "vllm" and p.name.startswith("_C_")]
    got = fatbin.read_library(c)
    assert got.kernels_known
    assert set(got.fp4_targets) == {"sm_100f", "sm_120f"}, got.fp4_targets
    assert {"sm_75", "sm_80", "sm_90a", "sm_100", "sm_120"} <= set(got.targets)  # the rest of the build
    assert any(e.runs_on(GB10) for e in got.fp4_entries)


@needs_034
def test_gb10_is_covered_by_vllm_034_and_a_seeded_sm100a_library_is_not(tmp_path):
    libs = vllm_034_libraries()
    ok = doctor_kernels.check(probe(libs), cuda=False)
    assert ok.status == checks.OK and "sm_120f" in ok.detail and "sm_121" in ok.detail
    seeded = tmp_path / "_C.abi3.so"
    seeded.write_bytes(img.library([img.entry(100, "a", ["_ZN4vllm15cvt_fp16_to_fp4I6__halfEEvv"])]))
    bad = doctor_kernels.check(probe([seeded] + [p for p in libs if "_C" not in p.name]), cuda=False)
    assert bad.status == checks.FAIL and "sm_100a" in bad.detail and bad.fix


def run_doctor(python, *args) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([str(python), "-m", "vllm_spark_plugin.cli", "doctor", "--json", *args], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr[-2000:]
    return {c["name"]: c for c in json.loads(out.stdout[out.stdout.index("{"):])["checks"]}


def test_doctor_json_says_not_applicable_on_the_cpu_build():
    c = run_doctor(sys.executable)["fp4_kernel_payload"]
    assert c["status"] == checks.NA and "not a CUDA build" in c["detail"]


@needs_034
def test_doctor_json_in_the_034_environment_checks_for_a_gb10():
    c = run_doctor(ENV_034 / "bin" / "python", "--sm", "12.1")["fp4_kernel_payload"]
    assert c["status"] == checks.OK and "_C_stable_libtorch.abi3.so (sm_120f)" in c["detail"]
