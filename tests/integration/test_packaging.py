"""The plugin's build: an editable install is quiet (no build-backend warning or notice for the
set-up log to carry) and still installs the package and its entry points.

Runs setuptools' PEP 660 hook, as pip does for `pip install -e .` (warnings filtered as pip leaves them),
on a copy of the tracked files."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BUILD = """
import sys
import setuptools.build_meta as backend
print(backend.build_editable(sys.argv[1]))
"""


WHEEL = """
import sys
import setuptools.build_meta as backend
print(backend.build_wheel(sys.argv[1]))
"""
# Test doubles that ship in the wheel, and why (docs/architecture.md, "Test doubles in the wheel"):
# the NVML fake backs `gpu_check --dry`; the fake server is the known-truth target `vllm-spark bench`
# is checked against (docs/bench.md).
SHIPPED_DOUBLES = {"vllm_spark_plugin/gpu_check/fake_nvml.py", "vllm_spark_plugin/testbed/fake_server.py"}


def tracked_copy(tmp_path: Path) -> tuple[Path, list[str]]:
    """The tracked files in a folder of their own (what a clone builds from) and their paths."""
    tracked = [rel for rel in subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                             check=True).stdout.decode().split("\0") if rel and (ROOT / rel).is_file()]
    src = tmp_path / "src"
    for rel in tracked:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    return src, tracked


def test_editable_build_is_quiet_and_complete(tmp_path):
    src, _tracked = tracked_copy(tmp_path)
    out = tmp_path / "wheel"
    out.mkdir()
    r = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=src, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    noisy = [line for line in r.stderr.splitlines()
             if any(w in line for w in ("Warning", "!!", "deprecat", "Editable installation"))]
    assert not noisy, "\n".join(noisy)
    wheel = out / r.stdout.split()[-1]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        pth = [n for n in names if n.endswith(".pth")]
        assert len(pth) == 1 and z.read(pth[0]).decode().strip() == str(src.resolve())
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "vllm_spark_plugin:register" in entry_points
    assert "vllm_spark_plugin.hooks.stat_logger:SparkStatLogger" in entry_points


def test_the_wheel_holds_the_package_its_version_and_only_the_named_test_doubles(tmp_path):
    src, tracked = tracked_copy(tmp_path)
    out = tmp_path / "wheel"
    out.mkdir()
    r = subprocess.run([sys.executable, "-c", WHEEL, str(out)], cwd=src, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with zipfile.ZipFile(out / r.stdout.split()[-1]) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    modules = {n for n in tracked if n.startswith("vllm_spark_plugin/") and n.endswith(".py")}
    assert modules <= names, sorted(modules - names)[:5]
    assert {n.split("/")[0] for n in names} == {"vllm_spark_plugin", next(n for n in names if ".dist-info/" in n).split("/")[0]}
    assert {n for n in names if Path(n).name.startswith("fake")} == SHIPPED_DOUBLES
    version = {}
    exec((ROOT / "vllm_spark_plugin" / "_version.py").read_text(), version)
    assert f"\nVersion: {version['__version__']}\n" in metadata
