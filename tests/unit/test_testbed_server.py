"""Which plugin a test-bed server imports: what `benchmarks/guard_effect.py --guard-b` relies on to run
two versions of the loop side by side."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vllm_spark_plugin.testbed.server import VllmServer, plugin_origin

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def other_version(tmp_path: Path) -> Path:
    (tmp_path / "vllm_spark_plugin").mkdir()
    (tmp_path / "vllm_spark_plugin" / "__init__.py").write_text("")
    return tmp_path.resolve()


def test_started_from_the_checkout_the_checkouts_plugin_shadows_pythonpath(tmp_path):
    """The trap: `python -m` puts the working directory ahead of PYTHONPATH, so a server started from this
    checkout imports this checkout's plugin whatever PYTHONPATH names."""
    b = other_version(tmp_path)
    assert plugin_origin(sys.executable, ROOT, {"PYTHONPATH": str(b)}) == ROOT / "vllm_spark_plugin"


def test_started_from_the_other_checkout_the_server_imports_its_plugin(tmp_path):
    b = other_version(tmp_path)
    assert plugin_origin(sys.executable, b, {"PYTHONPATH": str(b)}) == b / "vllm_spark_plugin"
    assert VllmServer(model_path="m", port=1, cwd=b).cwd == b
