"""Start a vLLM OpenAI server (CPU build here, CUDA on a Spark) with or without the plugin.

Used by the demo, the benchmarks and the test suite.  The server runs in its own process group so
`stop()` takes down the API server and every engine/worker process it spawned.  When start-up fails,
the error carries the tail of the server's log.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN_NAME = "spark"  # the entry-point name in every vLLM plugin group


class ServerStartError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        data = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(data[-lines:])


def cpu_env() -> dict[str, str]:
    """Environment the CPU build of vLLM needs on these machines (docs/testing.md, 'The CPU test bed')."""
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def plugin_origin(python: str, cwd: Path, env: dict[str, str] | None = None) -> Path:
    """The vllm_spark_plugin package a server started in `cwd` with `env` imports: `python -m` puts the
    working directory ahead of PYTHONPATH, so a checkout there wins over the one PYTHONPATH names."""
    out = subprocess.run([python, "-c", "import vllm_spark_plugin, os; print(os.path.dirname(vllm_spark_plugin.__file__))"],
                         cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()).resolve()


def is_cpu_vllm() -> bool:
    try:
        from importlib.metadata import distribution
        distribution("vllm-cpu")
        return True
    except Exception:
        return False


def prioritize_client(niceness: int = -15) -> bool:
    """Let this (client) process, and the processes it starts, preempt the engine's compute threads
    and the API server (at -10, VllmServer.prioritize_frontend), so token arrivals are timed when they
    happen: a real client has a machine of its own, and a test client that falls behind reading its
    streams would time its own backlog.  Needs root; returns False when not permitted."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
        return True
    except (PermissionError, OSError):
        return False


def _normal_priority() -> None:
    """The server and the engine processes it spawns run at normal priority, even when the caller
    (a test client, see VllmServer.prioritize_frontend) raised its own."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) < 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass


@dataclass
class VllmServer:
    model_path: str
    served_name: str = "tiny-qwen3-moe"
    port: int = 0
    plugin: bool = True
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    max_model_len: int = 2048
    python: str = sys.executable
    cwd: Path | None = None        # `python -m` puts this first on the path: a checkout here shadows PYTHONPATH

    proc: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        if not self.port:
            self.port = free_port()
        if self.log_path is None:
            self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-server-{self.port}.log"
        self.log_path = Path(self.log_path)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"

    @property
    def model(self) -> str:
        return self.served_name

    def command(self) -> list[str]:
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(self.model_path), "--served-model-name", self.served_name,
               "--host", "127.0.0.1", "--port", str(self.port),
               "--max-model-len", str(self.max_model_len)]
        if is_cpu_vllm():
            cmd += ["--enforce-eager", "--dtype", "bfloat16"]
        return cmd + list(self.extra_args)

    def start(self, timeout: float = 600.0) -> "VllmServer":
        env = dict(os.environ)
        if is_cpu_vllm():
            env.update(cpu_env())
        # Allow-list: only the plugin (or nothing) is loaded, so A/B runs differ in the plugin alone.
        env["VLLM_PLUGINS"] = PLUGIN_NAME if self.plugin else ""
        env.update(self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                     preexec_fn=_normal_priority, cwd=self.cwd)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerStartError(
                    f"vLLM server exited with code {rc} during start-up; last lines of {self.log_path}:\n"
                    + log_tail(self.log_path))
            if self.healthy():
                return self
            time.sleep(1.0)
        tail = log_tail(self.log_path)
        self.stop()
        raise ServerStartError(f"vLLM server not healthy after {timeout:.0f}s; last lines of {self.log_path}:\n{tail}")

    def prioritize_frontend(self, niceness: int = -10) -> bool:
        """Give the API server (the process that streams tokens out) CPU priority over the engine.

        On a 2-core test machine the engine's compute threads can starve the API server and the
        client for hundreds of milliseconds, and tokens then reach the client in bursts that distort
        client-side timings.  A Spark has 20 cores and no such contention.  Needs root; returns False
        when not permitted.
        """
        try:
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, niceness)
            return True
        except (PermissionError, OSError, AttributeError):
            return False

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left."""
        if self.proc is None:
            return
        try:
            pgid = os.getpgid(self.proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)  # engine/worker children that ignored SIGTERM
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
