"""How the engine core and the workers hand per-step records and contained errors to the API server.

The plugin adds nothing to vLLM's own stats objects (a field borrowed from them could be filled by
vLLM itself, and popping our entries before vLLM's loggers read them depends on the order vLLM
calls loggers in).  It has a channel of its own instead:

* a run directory shared by the processes of one `vllm serve`: `SPARK_PLUGIN_RUN_DIR`, created by the
  first process that loads the plugin.  The API server loads plugins while it parses its arguments,
  before it starts the engine core, so the engine core and the workers inherit it;
* per-step records: a Unix datagram socket in that directory, bound by the API server's stat logger.
  The engine core packs fixed-size records and sends them in batches (every 64 steps or 50 ms, and
  whenever the engine goes idle), one non-blocking `sendto` each.  Nobody listening (offline `LLM`,
  the stat logger off): the batch is dropped and counted, never retried;
* contained errors of processes that export nothing (engine core, workers): a small JSON file per
  process, rewritten at most once a second; the API server adds their increments to
  `vllm_spark_plugin_errors_total`.

Multi-node engines do not share the run directory; their steps and errors stay on their own node.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import tempfile
import threading
import time

from vllm_spark_plugin import settings
from vllm_spark_plugin.metrics.step import LAYOUT, HookStep, InvalidStep, read_records
from vllm_spark_plugin.settings import RUN_DIR_KEY as RUN_DIR_ENV

STEPS_SOCKET = "steps.sock"
ERRORS_PREFIX = "errors-"

BATCH_RECORDS = 64
BATCH_SECONDS = 0.05


def run_dir() -> str | None:
    d = settings.internal(RUN_DIR_ENV)
    return d if d and os.path.isdir(d) else None


def ensure_run_dir() -> str:
    """The run directory of this `vllm serve`, created (and removed at exit) by the first process."""
    d = run_dir()
    if d is None:
        d = tempfile.mkdtemp(prefix="vllm-spark-")
        os.environ[RUN_DIR_ENV] = d
        creator = os.getpid()
        atexit.register(lambda: os.getpid() == creator and shutil.rmtree(d, ignore_errors=True))
    return d


def _socket_address(directory: str) -> str:
    path = os.path.join(directory, STEPS_SOCKET)
    if len(path.encode()) < 100:
        return path
    return "\0vllm-spark-" + os.path.basename(directory)  # a long TMPDIR: Linux abstract namespace


class StepWriter:
    """Engine-core side: batches records and sends them without ever blocking the engine loop."""

    def __init__(self, directory: str, clock=time.perf_counter) -> None:
        self.address = _socket_address(directory)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.clock = clock
        self.buf = bytearray()
        self.pending = 0
        self.last_send = clock()
        self.sent = 0
        self.dropped = 0

    def add(self, step: HookStep) -> None:
        self.buf += LAYOUT.pack(*step)
        self.pending += 1
        if self.pending >= BATCH_RECORDS or self.clock() - self.last_send >= BATCH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        n, self.pending = self.pending, 0
        self.last_send = self.clock()
        try:
            self.sock.sendto(bytes(self.buf), self.address)
            self.sent += n
        except OSError:  # nobody listening, or its buffer is full: these steps are lost, not retried
            self.dropped += n
        self.buf.clear()


class StepReader:
    """API-server side: one daemon thread that receives batches and calls `on_step(HookStep)` for each
    valid record and `on_invalid(fields)` for each other.

    `start()` returns False when the socket cannot be bound (another API server of the same
    `vllm serve` already reads it: with several API servers one of them takes the engine's steps).
    """

    def __init__(self, directory: str, on_step, on_invalid, on_error) -> None:
        self.address = _socket_address(directory)
        self.on_step = on_step
        self.on_invalid = on_invalid
        self.on_error = on_error
        self.sock: socket.socket | None = None
        self.received = 0
        self._stop = threading.Event()

    def start(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(self.address)
        except OSError:
            sock.close()
            return False
        try:  # room for a few seconds of steps if this thread is starved of the GIL
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        except OSError:
            pass
        sock.settimeout(0.5)
        self.sock = sock
        threading.Thread(target=self._run, name="vllm-spark-steps", daemon=True).start()
        return True

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError as exc:
                self.on_error("step_channel", exc)
                return
            try:
                self.deliver(data)
            except Exception as exc:
                self.on_error("step_channel", exc)

    def deliver(self, data: bytes) -> None:
        """Hand one datagram's records on (the receive loop; benchmarks feed recorded batches)."""
        on_step, on_invalid = self.on_step, self.on_invalid
        for fields in read_records(data):
            self.received += 1
            try:
                step = HookStep.from_wire(fields)
            except InvalidStep:
                on_invalid(fields)
                continue
            on_step(step)


# --- contained errors of processes without an exporter ---------------------------------------------
def spill_errors(counts: dict[str, int]) -> None:
    """Write this process's error counts (cumulative) where the API server will find them."""
    d = run_dir()
    if d is None:
        return
    path = os.path.join(d, f"{ERRORS_PREFIX}{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(counts, fh)
    os.replace(tmp, path)


def drop_spilled() -> None:
    d = run_dir()
    if d is not None:
        try:
            os.unlink(os.path.join(d, f"{ERRORS_PREFIX}{os.getpid()}.json"))
        except FileNotFoundError:
            pass


def read_spilled() -> dict[int, dict[str, int]]:
    """pid -> cumulative counts by `where`, for every other process of this run (unreadable files
    are skipped: they are rewritten whole, so the next read sees them)."""
    d = run_dir()
    out: dict[int, dict[str, int]] = {}
    if d is None:
        return out
    me = os.getpid()
    for name in os.listdir(d):
        if not (name.startswith(ERRORS_PREFIX) and name.endswith(".json")):
            continue
        try:
            pid = int(name[len(ERRORS_PREFIX):-5])
            if pid == me:
                continue
            with open(os.path.join(d, name), encoding="utf-8") as fh:
                counts = json.load(fh)
            out[pid] = {str(k): int(v) for k, v in counts.items()}
        except (OSError, ValueError, AttributeError):
            continue
    return out
