"""vLLM's router (`vllm-router`, installed by scripts/router-env.sh) in front of servers of the test
bed: started on free loopback ports, ready when it answers /health, stopped with its process group.
Used by tests/integration/test_router.py and benchmarks/router_effect.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from vllm_spark_plugin.testbed.server import ServerStartError, free_port, log_tail

ROOT = Path(__file__).resolve().parents[2]
ENV_SCRIPT = ROOT / "scripts" / "router-env.sh"


def router_binary() -> str:
    """The `vllm-router` command (installing its environment the first time: a few minutes)."""
    out = subprocess.run(["bash", str(ENV_SCRIPT)], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


@dataclass
class Router:
    workers: list[str]  # base URLs of the servers
    policy: str = "power_of_two"
    poll_seconds: int = 1  # --worker-startup-check-interval: how often power_of_two polls /get_load
    log_path: Path | None = None
    binary: str = ""
    port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        return [self.binary or router_binary(), "--host", "127.0.0.1", "--port", str(self.port),
                "--worker-urls", *self.workers, "--policy", self.policy,
                "--worker-startup-check-interval", str(self.poll_seconds),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
                "--log-level", "warning"]

    def start(self, timeout: float = 60.0) -> "Router":
        self.port = self.port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        self.log_path = Path(self.log_path or f"/tmp/vllm-router-{self.port}.log")
        cmd = self.command()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"vllm-router exited with code {self.proc.returncode}; last lines of "
                                       f"{self.log_path}:\n{log_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        tail = log_tail(self.log_path)
        self.stop()
        raise ServerStartError(f"vllm-router not healthy after {timeout:.0f}s; last lines of {self.log_path}:\n{tail}")

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc = None

    def __enter__(self) -> "Router":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
