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


def test_editable_build_is_quiet_and_complete(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    src = tmp_path / "src"
    for rel in filter(None, tracked.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
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
