"""The receiving end of the link probe: `vllm-spark doctor --link-serve [ADDR:]PORT`.

Separate from the probe (link_probe.py) because it is the other host's half: it listens, grants
limits no larger than its own, counts what arrives within its window and reports it; the wire format
and the bounds both sides share are link_wire.py's.
"""
from __future__ import annotations

import secrets
import select
import socket
import threading
import time
from collections.abc import Callable

from vllm_spark_plugin.doctor.link_wire import (
    CHUNK,
    DEFAULT_PORT,
    MAX_STREAMS,
    POLL_SECONDS,
    PROTOCOL,
    SETUP_TIMEOUT,
    Budget,
    Limits,
    read_json,
    read_line,
    send_json,
)


class LinkServer:
    """Listens on ADDR:PORT and serves one probe at a time under its own limits; others are told it is busy."""

    def __init__(self, host: str = "", port: int = DEFAULT_PORT, limits: Limits = Limits()):
        """`host` "" listens on every address, IPv6 and IPv4 where the host has both."""
        self.limits = limits
        if not host:
            dual = socket.has_dualstack_ipv6()
            self._sock = socket.create_server(("", port), family=socket.AF_INET6 if dual else socket.AF_INET,
                                              backlog=2 * MAX_STREAMS, dualstack_ipv6=dual)
        else:
            family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            self._sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self._sock.bind(sockaddr)
                self._sock.listen(2 * MAX_STREAMS)
            except OSError:
                self._sock.close()
                raise
        self._sock.settimeout(POLL_SECONDS)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return host, port

    def close(self) -> None:
        self._sock.close()

    def serve(self, count: int = 1, stop: threading.Event | None = None,
              log: Callable[[str], None] = lambda _line: None) -> int:
        """Serve `count` probes (0: until `stop` is set); returns how many completed."""
        stop = stop or threading.Event()
        served = 0
        while (count == 0 or served < count) and not stop.is_set():
            conn = self._accept()
            if conn is None:
                continue
            with conn:
                completed, line = self._session(conn)
            log(line)
            served += completed
        return served

    def _accept(self) -> socket.socket | None:
        try:
            conn, _ = self._sock.accept()
        except socket.timeout:
            return None
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _session(self, control: socket.socket) -> tuple[bool, str]:
        """One probe: hello, data streams, transfer, report.  (completed, one line for the log)."""
        peer = control.getpeername()[0]
        setup_deadline = time.monotonic() + SETUP_TIMEOUT
        try:
            hello = read_json(control, setup_deadline)
            if hello.get("probe") != PROTOCOL:
                raise ValueError(f"not a {PROTOCOL} hello")
            asked = Limits(float(hello["seconds"]), int(hello["bytes"]), int(hello["streams"]))
        except (socket.timeout, OSError, ValueError, KeyError, TypeError) as exc:
            _answer(control, {"ok": False, "error": f"bad hello: {exc}"})
            return False, f"refused {peer}: bad hello ({exc})"
        limits = asked.within(self.limits)
        token = secrets.token_hex(16)
        _answer(control, {"ok": True, "token": token, "streams": limits.streams, "seconds": limits.seconds,
                          "bytes": limits.bytes})
        data: list[socket.socket] = []
        try:
            while len(data) < limits.streams and time.monotonic() < setup_deadline:
                if _closed(control):
                    return False, f"aborted probe from {peer}: it closed before its data streams arrived"
                conn = self._accept()
                if conn is not None:
                    if _first_line(conn, setup_deadline) == token.encode():
                        data.append(conn)
                    else:
                        _turn_away(conn)
            if len(data) < limits.streams:
                _answer(control, {"go": False, "error": f"only {len(data)} of {limits.streams} data streams "
                                                        f"arrived within {SETUP_TIMEOUT:g} s"})
                return False, f"aborted probe from {peer}: {len(data)} of {limits.streams} data streams arrived"
            return self._transfer(control, data, limits, peer)
        finally:
            for s in data:
                s.close()

    def _transfer(self, control: socket.socket, data: list[socket.socket], limits: Limits,
                  peer: str) -> tuple[bool, str]:
        budget = Budget(limits.bytes, time.monotonic)
        _answer(control, {"go": True})
        start = time.monotonic()
        deadline = start + limits.seconds
        readers = [threading.Thread(target=_receive_until, args=(s, budget, deadline), daemon=True) for s in data]
        for t in readers:
            t.start()
        while any(t.is_alive() for t in readers):
            conn = self._accept()   # a probe that arrives meanwhile is told to wait
            if conn is not None:
                _first_line(conn, time.monotonic() + 1.0)
                _turn_away(conn)
            for t in readers:
                t.join(0.01)
        window = (budget.last - start) if budget.last is not None else 0.0
        ended = "byte limit" if budget.exhausted else ("time limit" if time.monotonic() >= deadline else "eof")
        _answer(control, {"bytes": budget.moved, "seconds": window, "ended": ended})
        rate = budget.moved / window * 8 / 1e9 if window > 0 else 0.0
        return True, (f"probe from {peer}: {len(data)} stream(s), {budget.moved} bytes in {window:.2f} s "
                      f"= {rate:.2f} Gb/s ({ended})")


def _answer(sock: socket.socket, message: dict) -> None:
    try:
        sock.settimeout(1.0)
        send_json(sock, message)
    except OSError:
        pass


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed `sock` (readable with nothing to read), without waiting or consuming."""
    try:
        if not select.select([sock], [], [], 0)[0]:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _first_line(conn: socket.socket, deadline: float) -> bytes:
    """A new connection's first line (b"" when none comes within a second or by the deadline)."""
    try:
        return read_line(conn, min(deadline, time.monotonic() + 1.0))
    except (socket.timeout, OSError, ValueError):
        return b""


def _turn_away(conn: socket.socket) -> None:
    """Someone who is not a data stream of the running probe: read (above), told, closed (no reset)."""
    with conn:
        _answer(conn, {"ok": False, "error": "busy: another probe is running, try again in a minute"})


def _receive_until(sock: socket.socket, budget: Budget, deadline: float) -> None:
    """One stream's receiver: counts what arrives before the deadline, never past the shared byte limit."""
    buf = memoryview(bytearray(CHUNK))
    sock.settimeout(POLL_SECONDS)
    while True:
        want = budget.take(CHUNK)
        if not want:
            if budget.exhausted or time.monotonic() >= deadline:
                return
            time.sleep(0.001)   # the other streams still hold the rest
            continue
        try:
            n = sock.recv_into(buf, want)
        except socket.timeout:
            n = -1
        except OSError:
            n = 0
        late = time.monotonic() >= deadline
        budget.settle(want, 0 if late or n < 0 else n)
        if n == 0 or late:
            return
