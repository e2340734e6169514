"""The test bed's CPU-priority helpers are best effort: without the right (root), raising a priority
fails quietly and nothing else changes, so no test outcome depends on who runs the suite.

The helpers run in a forked child of this test process, as an unprivileged user: the suite's own
user, or `nobody` (effective uid, which drops every capability) when the suite runs as root.  So
this process's priority is never touched, and nothing needs to start a new interpreter (one that
lives under /root cannot be started by `nobody`).
"""
from __future__ import annotations

import json
import os
import subprocess
import traceback

from vllm_spark_plugin.testbed.server import VllmServer, _normal_priority, prioritize_client

NOBODY = 65534


def _unprivileged_attempt() -> dict:
    if os.geteuid() == 0:
        # back to the default priority first: in a full run the session has already raised this
        # process's priority (as root), and a child at -15 asking for -15 would change nothing
        os.setpriority(os.PRIO_PROCESS, 0, 0)
        os.setgroups([])
        os.setegid(NOBODY)
        os.seteuid(NOBODY)
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
    return out


def _in_forked_child(fn) -> dict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running pytest's exit handlers
        os.close(read)
        try:
            payload = {"ok": fn()}
        except BaseException:  # noqa: BLE001 - reported to the parent
            payload = {"error": traceback.format_exc()}
        os.write(write, json.dumps(payload).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        payload = json.loads(fh.read() or '{"error": "the child wrote nothing"}')
    os.waitpid(pid, 0)
    assert "ok" in payload, payload.get("error")
    return payload["ok"]


def test_raising_priority_without_root_fails_quietly_and_changes_nothing():
    out = _in_forked_child(_unprivileged_attempt)
    assert out["euid"] != 0
    assert out["client"] is False and out["nice_after"] == out["nice_before"]
    assert out["frontend_not_started"] is False
    assert out["frontend"] is False and out["frontend_nice"] == out["nice_before"]
