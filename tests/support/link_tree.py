"""The recorded Spark sysfs tree (tests/fixtures/links/spark), built with its symlinks at test time.

Sysfs links point back up their own tree (`net/IF/device` -> the PCI function above it), so a tree
committed with them is a cycle for anything that walks the checkout following links (setuptools'
package discovery during an editable install spun on it).  The repository keeps the files, and the
links as text (`symlinks.txt`: `path -> target`, exactly what `readlink` gave); `SPARK_SYS` is a
copy with the links made, built once per process.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "links"
RECORDED = FIXTURES / "spark"


def build(dest: Path) -> Path:
    """Copy the recorded tree to `dest`/sys and make its symlinks; returns `dest`/sys."""
    shutil.copytree(RECORDED / "sys", dest / "sys")
    for line in (RECORDED / "symlinks.txt").read_text().splitlines():
        if not line.strip():
            continue
        path, _, target = line.partition(" -> ")
        link = dest / path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)
    return dest / "sys"


_ROOT = Path(tempfile.mkdtemp(prefix="spark-sysfs-"))
atexit.register(shutil.rmtree, _ROOT, True)
SPARK_SYS = build(_ROOT)
