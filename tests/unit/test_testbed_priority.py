"""The test bed's CPU-priority helpers are best effort: without the right (root), raising a priority
fails quietly and nothing else changes, so no test outcome depends on who runs the suite.

The helpers run in a child process as an unprivileged user (the suite's own user, or, when the suite
runs as root, root's child switches its effective user to `nobody` once Python has started: the
interpreter may live where `nobody` cannot read), so this test process's priority is never touched.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, subprocess, sys
from vllm_spark_plugin.testbed.server import VllmServer, _normal_priority, prioritize_client

if os.geteuid() == 0:
    os.setgroups([])
    os.setegid(65534)
    os.seteuid(65534)  # drops every capability, CAP_SYS_NICE included
out = {"euid": os.geteuid(), "nice_before": os.getpriority(os.PRIO_PROCESS, 0)}
out["client"] = prioritize_client()
out["nice_after"] = os.getpriority(os.PRIO_PROCESS, 0)
server = VllmServer(model_path="/nonexistent", port=1, log_path="/dev/null")
out["frontend_not_started"] = server.prioritize_frontend()
server.proc = subprocess.Popen(["sleep", "30"], preexec_fn=_normal_priority)
try:
    out["frontend"] = server.prioritize_frontend()
    out["frontend_nice"] = os.getpriority(os.PRIO_PROCESS, server.proc.pid)
finally:
    server.proc.kill()
    server.proc.wait()
print(json.dumps(out))
"""


def test_raising_priority_without_root_fails_quietly_and_changes_nothing():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, cwd="/",
                          env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["euid"] != 0
    assert out["client"] is False and out["nice_after"] == out["nice_before"]
    assert out["frontend_not_started"] is False
    assert out["frontend"] is False and out["frontend_nice"] == out["nice_before"]
