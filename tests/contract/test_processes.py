"""Claims about the plugin's commands and helpers that need a process of their own: the command-line
entry in a fresh interpreter (what it imports, its exit status and one-line errors) and errors
contained in a second process reaching the API server's counter.  Starting interpreters costs
seconds of CPU each on two cores, so these live here and not in the unit tier, which checks the
same commands in process (tests/unit/test_plan_cli.py, test_knee_cli.py, test_doctor_links.py,
test_channel.py)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter
from support.knee_sweeps import sweep_file

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.hooks import channel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(channel.RUN_DIR_ENV, str(tmp_path))
    return str(tmp_path)


def test_the_module_entry_runs_plan_and_fails_in_one_line():
    """`python -m vllm_spark_plugin.cli plan`: the table, and a usage error as exit 2 without a traceback."""
    cmd = [sys.executable, "-m", "vllm_spark_plugin.cli", "plan"]
    ok = subprocess.run(cmd + ["--model", "Qwen3.6-35B-A3B", "--concurrency", "1,8,64"], capture_output=True,
                        text=True, cwd=ROOT, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "knee K = alpha/beta" in ok.stdout and "Capacity at the 20 tok/s per-stream floor" in ok.stdout
    bad = subprocess.run(cmd + ["--model", "No-Such-Model-9B"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "unknown model 'No-Such-Model-9B'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_subcommand_runs_without_importing_torch_or_vllm(tmp_path):
    f = sweep_file(tmp_path / "s.csv")
    code = ("import sys; from vllm_spark_plugin.cli import main; rc = main(['knee', sys.argv[1], '--json', "
            "'--bootstrap', '50']); bad = [m for m in ('torch', 'vllm') if m in sys.modules]; "
            "assert not bad, bad; sys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code, f], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)) == {"marlin", "cutlass"}


def test_errors_of_a_process_without_exporter_reach_the_api_servers_counter(run_dir):
    """A real second process (as the engine core is) contains three errors; the API server's
    counter gets exactly those, once, however often it looks."""
    code = (
        "import time\n"
        "from vllm_spark_plugin.hooks import registration\n"
        "from vllm_spark_plugin.common import errors\n"
        "errors.set_spill(registration._spill)\n"
        "for _ in range(3): errors.report('scheduler_hook', ValueError('boom'))\n"
        "time.sleep(errors.SPILL_DELAY_SECONDS + 0.5)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "contained error in scheduler_hook" in proc.stderr  # logged once ...
    assert proc.stderr.count("contained error") == 1           # ... not three times
    spilled = channel.read_spilled()
    assert list(spilled.values()) == [{"scheduler_hook": 3}]
    counter = Counter("plugin_errors", "test", ("where",), registry=CollectorRegistry())
    seen: dict = {}
    assert errors.absorb(spilled, seen, counter) == 3
    assert errors.absorb(channel.read_spilled(), seen, counter) == 0  # already counted
    assert counter.labels(where="scheduler_hook")._value.get() == 3


def test_the_command_line_errors_are_one_line():
    cli = [sys.executable, "-m", "vllm_spark_plugin.cli", "doctor"]
    both = subprocess.run(cli + ["--link-probe", "127.0.0.1", "--link-serve", "7471"], capture_output=True, text=True,
                          timeout=60)
    assert both.returncode == 2 and "two ends" in both.stderr
    big = subprocess.run(cli + ["--link-probe", "127.0.0.1", "--link-seconds", "61"], capture_output=True, text=True,
                         timeout=60)
    assert big.returncode == 2 and "--link-seconds must be in [0.1, 60]" in big.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = subprocess.run(cli + ["--link-probe", f"127.0.0.1:{s.getsockname()[1]}"], capture_output=True,
                                 text=True, timeout=60)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("vllm-spark doctor: link probe failed: ")

