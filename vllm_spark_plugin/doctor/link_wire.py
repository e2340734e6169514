"""What both ends of the link probe share: the protocol, its limits and its time bounds.

The probe (link_probe.py) and the server (link_server.py) each import this and not each other, so
neither side can drift from the wire format or the bounds the other enforces.

The protocol, one JSON line each way on a control connection:
  probe -> server  {"probe": PROTOCOL, "streams": n, "seconds": s, "bytes": b}
  server -> probe  {"ok": true, "token": t, "streams": n', "seconds": s', "bytes": b'} (the limits it accepts)
  probe opens n' data connections, each first sending the line t
  server -> probe  {"go": true} once all n' arrived; both clocks start; the probe sends zeros
  server -> probe  {"bytes": received, "seconds": window, "ended": why} after EOF, byte or time limit
The achieved rate is what the server received within its window, so bytes still sitting in the
sender's buffers are not counted.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

PROTOCOL = "vllm-spark-link/1"
DEFAULT_PORT = 7471
DEFAULT_SECONDS, MAX_SECONDS = 10.0, 60.0
DEFAULT_BYTES, MAX_BYTES = 1 << 30, 16 << 30
DEFAULT_STREAMS, MAX_STREAMS = 4, 16
SETUP_TIMEOUT = 5.0    # connect, hello and every data stream, all together
REPORT_TIMEOUT = 3.0   # the server's report after the traffic ends
STALL_SECONDS = 3.0    # a send without progress this long: the peer stopped reading or the path dropped
CHUNK = 1 << 20
POLL_SECONDS = 0.25    # how often a blocked send or receive looks at the clock
_LINE_MAX = 4096


class ProbeError(Exception):
    """Why a probe could not measure: one line that names the cause and what to do."""


@dataclass(frozen=True)
class Limits:
    seconds: float = DEFAULT_SECONDS
    bytes: int = DEFAULT_BYTES
    streams: int = DEFAULT_STREAMS

    def __post_init__(self) -> None:
        if not 0 < self.seconds <= MAX_SECONDS:
            raise ValueError(f"link time limit {self.seconds:g} s is not in (0, {MAX_SECONDS:g}] s")
        if not 0 < self.bytes <= MAX_BYTES:
            raise ValueError(f"link byte limit {self.bytes} is not in (0, {MAX_BYTES}] bytes (16 GiB)")
        if not 1 <= self.streams <= MAX_STREAMS:
            raise ValueError(f"link streams {self.streams} is not in [1, {MAX_STREAMS}]")

    def within(self, other: Limits) -> Limits:
        """The stricter of two sets of limits (what a server grants a probe)."""
        return Limits(min(self.seconds, other.seconds), min(self.bytes, other.bytes), min(self.streams, other.streams))


def parse_endpoint(text: str, default_host: str | None = None) -> tuple[str, int]:
    """`HOST`, `HOST:PORT`, `[V6]:PORT`, `V6`, `PORT` or `:PORT` (the last two only with default_host)."""
    text = text.strip()
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
    elif text.count(":") == 1:
        host, port = text.split(":")
    elif text.isdigit():
        host, port = "", text
    if not host:
        if default_host is None:
            raise ValueError(f"no host in {text!r} (use HOST or HOST:PORT)")
        host = default_host
    try:
        number = int(port) if port else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"port {port!r} in {text!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"port {number} in {text!r} is not in 0-65535")
    return host, number


def hostport(host: str, port: int) -> str:
    """HOST:PORT, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- framing: one JSON line per message, every read bounded by a deadline ---------------------------

def send_json(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def read_line(sock: socket.socket, deadline: float, clock: Callable[[], float] = time.monotonic) -> bytes:
    """One line (without the newline); socket.timeout at the deadline, ValueError on EOF or an overlong line."""
    data = b""
    while b"\n" not in data:
        left = deadline - clock()
        if left <= 0:
            raise socket.timeout("no complete line before the deadline")
        sock.settimeout(left)
        got = sock.recv(_LINE_MAX)
        if not got:
            raise ValueError(f"connection closed after {data[:60]!r}" if data else "connection closed")
        data += got
        if len(data) > _LINE_MAX:
            raise ValueError(f"line longer than {_LINE_MAX} bytes: {data[:60]!r}")
    return data.split(b"\n", 1)[0]


def read_json(sock: socket.socket, deadline: float) -> dict:
    line = read_line(sock, deadline)
    try:
        message = json.loads(line)
    except ValueError:
        raise ValueError(f"not a JSON line: {line[:60]!r}") from None
    if not isinstance(message, dict):
        raise ValueError(f"not a JSON object: {line[:60]!r}")
    return message


class Budget:
    """The bytes one probe may still move, shared by its streams (so together they never exceed it).

    A stream reserves a chunk before each send or receive and settles what it really moved; a stream
    that finds nothing left while others still hold reservations waits for them (`exhausted` is the end)."""

    def __init__(self, limit: int, clock: Callable[[], float]):
        self._lock = threading.Lock()
        self.limit = limit
        self._left = limit
        self._clock = clock
        self.moved = 0
        self.last = None   # clock time of the last counted byte

    def take(self, want: int) -> int:
        with self._lock:
            got = min(want, self._left)
            self._left -= got
            return got

    def settle(self, taken: int, moved: int) -> None:
        with self._lock:
            self._left += taken - moved
            if moved:
                self.moved += moved
                self.last = self._clock()

    @property
    def exhausted(self) -> bool:
        with self._lock:
            return self.moved >= self.limit
