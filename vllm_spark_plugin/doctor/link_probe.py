"""`vllm-spark doctor --link-probe HOST[:PORT]` against `vllm-spark doctor --link-serve [ADDR:]PORT`:
the TCP throughput two hosts achieve, beside the negotiated rate of the interface the route uses.

Pure sockets, no third-party tool.  Opt-in and bounded on both sides: traffic flows for at most
`--link-seconds` (default 10, at most 60) and `--link-bytes` (default 1 GiB, at most 16 GiB), over
`--link-streams` parallel TCP streams (default 4, at most 16); the server applies its own limits to
every probe (the smaller of the two wins).  Setting up (connect, hello, data streams) must finish
within SETUP_TIMEOUT and the report must come within REPORT_TIMEOUT, so the whole command ends
within `--link-seconds` + 8 s; a send that makes no progress for STALL_SECONDS ends the probe.

This module is the sending end, the route and the verdict, and the command line of both ends; the
protocol and the bounds are link_wire.py's, the receiving end is link_server.py.  Data comes from a
memfd through sendfile(2): no copy on the sending side, so the probe's own ceiling is the receiver's
copy (measure it with a loopback probe).
"""
from __future__ import annotations

import errno
import json
import os
import select
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass

from vllm_spark_plugin.common.units import parse_size
from vllm_spark_plugin.doctor.link_server import LinkServer
from vllm_spark_plugin.doctor.link_wire import (
    CHUNK,
    DEFAULT_BYTES,
    DEFAULT_PORT,
    DEFAULT_SECONDS,
    DEFAULT_STREAMS,
    MAX_BYTES,
    MAX_SECONDS,
    MAX_STREAMS,
    POLL_SECONDS,
    PROTOCOL,
    REPORT_TIMEOUT,
    SETUP_TIMEOUT,
    STALL_SECONDS,
    Budget,
    Limits,
    ProbeError,
    hostport,
    parse_endpoint,
    read_json,
    send_json,
)

_SOURCE_BYTES = 64 << 20   # the zero-filled memfd sendfile reads from (sparse: no memory held)


# -- the route: which interface the traffic to an address leaves by ---------------------------------

def _hex_ipv4(word: str) -> int:
    return int.from_bytes(bytes.fromhex(word)[::-1], "big")   # /proc/net/route: host-order (little-endian) hex


def route_interface(peer: str, local: str | None = None, proc_net: str = "/proc/net") -> tuple[str | None, str]:
    """(interface, how it was found) for traffic to `peer` (an IP address).

    An address of this host (the connection's own local address, 127/8, ::1) goes over `lo`; otherwise
    the longest matching prefix of the main routing table (/proc/net/route, /proc/net/ipv6_route: this
    network namespace's own), lowest metric first.  Policy routing (ip rule) is not followed."""
    import ipaddress
    try:
        addr = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return None, f"{peer!r} is not an IP address"
    if addr.is_loopback or (local is not None and peer == local):
        return "lo", "an address of this host"
    best: tuple[int, int, str] | None = None   # (prefix length, -metric, interface)
    try:
        if addr.version == 4:
            table = f"{proc_net}/route"
            with open(table, encoding="ascii") as fh:
                for line in fh.read().splitlines()[1:]:
                    f = line.split()
                    if len(f) < 8 or not int(f[3], 16) & 0x1:   # RTF_UP
                        continue
                    dest, mask, metric = _hex_ipv4(f[1]), _hex_ipv4(f[7]), int(f[6])
                    if int(addr) & mask == dest:
                        cand = (bin(mask).count("1"), -metric, f[0])
                        best = cand if best is None or cand[:2] > best[:2] else best
        else:
            table = f"{proc_net}/ipv6_route"
            with open(table, encoding="ascii") as fh:
                for line in fh.read().splitlines():
                    f = line.split()
                    if len(f) < 10 or not int(f[8], 16) & 0x1 or int(f[8], 16) & 0x200:   # RTF_UP, not RTF_REJECT
                        continue
                    plen = int(f[1], 16)
                    net = ipaddress.ip_network((int(f[0], 16), plen))
                    if addr in net and f[9] != "lo":
                        cand = (plen, -int(f[5], 16), f[9])
                        best = cand if best is None or cand[:2] > best[:2] else best
    except (OSError, ValueError) as exc:
        return None, f"cannot read the routing table: {exc}"
    if best is None:
        return None, f"no route to {peer} in {table}"
    return best[2], table


def negotiated_rate(interface: str | None, sysfs_root: str = "/sys") -> tuple[float | None, str]:
    """(bytes/s or None, why unknown) of `interface` as the host's link sources read it."""
    if interface is None:
        return None, "interface unknown"
    if interface == "lo":
        return None, "loopback has no negotiated rate: this measures the host's own ceiling for the probe"
    from vllm_spark_plugin.common import link_sources
    link = link_sources.read_link(interface, sysfs_root=sysfs_root)
    if not link.exists:
        return None, f"{interface} is not in {sysfs_root}/class/net"
    if link.rate_bytes_per_second is None:
        return None, f"{interface} reports no link speed (a virtual or down interface)"
    return link.rate_bytes_per_second, ""


# -- the probe (client) -------------------------------------------------------------------------------

@dataclass
class ProbeResult:
    peer: str                 # as the user named it
    address: str              # the IP address connected to
    port: int
    interface: str | None     # the interface the route to `address` uses
    route: str                # how `interface` was found (or why not)
    streams: int
    seconds_limit: float      # the limits in force (the stricter of the probe's and the server's)
    bytes_limit: int
    bytes: int                # what the server received within its window
    seconds: float            # the server's window: from "go" to the last counted byte
    sent_bytes: int           # what this side handed to the kernel (>= bytes: buffers in flight)
    wall_seconds: float       # the whole probe, setup and report included
    ended: str                # "time limit", "byte limit", "peer closed"
    achieved_bytes_per_second: float
    negotiated_bytes_per_second: float | None
    negotiated_unknown: str   # why the negotiated rate is unknown ("" when known)

    @property
    def share(self) -> float | None:
        n = self.negotiated_bytes_per_second
        return self.achieved_bytes_per_second / n if n else None

    def as_dict(self) -> dict:
        return {**asdict(self), "share": self.share}


def _resolve(peer: str, port: int, deadline: float) -> tuple[int, tuple]:
    """(family, sockaddr) of the peer; a name the resolver does not answer by the deadline is an error."""
    found: list = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(peer, port, type=socket.SOCK_STREAM)[0])
        except (socket.gaierror, UnicodeError) as exc:
            found.append(exc)

    worker = threading.Thread(target=lookup, daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if not found:
        raise ProbeError(f"cannot resolve {peer}: no answer from the resolver within {SETUP_TIMEOUT:g} s")
    if isinstance(found[0], Exception):
        raise ProbeError(f"cannot resolve {peer}: {getattr(found[0], 'strerror', None) or found[0]}")
    family, _, _, _, sockaddr = found[0]
    return family, sockaddr


def _connect(sockaddr, family: int, deadline: float, what: str) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        sock.connect(sockaddr)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    except ConnectionRefusedError:
        sock.close()
        raise ProbeError(f"{what} refused the connection: start `vllm-spark doctor --link-serve PORT` there "
                         "(and open the port in its firewall)") from None
    except socket.timeout:
        sock.close()
        raise ProbeError(f"cannot reach {what}: no answer to the connection within {SETUP_TIMEOUT:g} s "
                         "(wrong address, host down, or a firewall dropping the port)") from None
    except OSError as exc:
        sock.close()
        raise ProbeError(f"cannot reach {what}: {exc.strerror or exc}") from None


class _Zeros:
    """What the probe sends: a sparse zero-filled memfd through sendfile(2); plain send() where either is missing."""

    def __init__(self):
        try:
            self.fd = os.memfd_create("vllm-spark-link-probe")
            os.ftruncate(self.fd, _SOURCE_BYTES)
        except (AttributeError, OSError):
            self.fd = None
        self.buffer = memoryview(bytes(CHUNK))

    def send(self, sock: socket.socket, offset: int, count: int) -> int:
        if self.fd is not None:
            try:
                return os.sendfile(sock.fileno(), self.fd, offset % (_SOURCE_BYTES - CHUNK), count)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                self.fd = None
        return sock.send(self.buffer[:count])

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _send_until(sock: socket.socket, zeros: _Zeros, budget: Budget, deadline: float, outcome: list) -> None:
    """One stream's sender: until the deadline, the shared budget, a stall or an error (appended to outcome)."""
    sock.setblocking(False)
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    offset, progress = 0, time.monotonic()
    while True:
        now = time.monotonic()
        if now >= deadline:
            return outcome.append("time limit")
        want = budget.take(CHUNK)
        if not want:
            if budget.exhausted:
                return outcome.append("byte limit")
            time.sleep(0.001)   # the other streams still hold the rest
            continue
        try:
            n = zeros.send(sock, offset, want)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            budget.settle(want, 0)
            return outcome.append(f"peer closed ({exc.strerror or exc})")
        budget.settle(want, n)
        offset += n
        if n:
            progress = now
        elif now - progress >= STALL_SECONDS:
            return outcome.append("stalled")
        else:
            poller.poll(max(1, int(min(POLL_SECONDS, deadline - now) * 1000)))


def probe(peer: str, port: int = DEFAULT_PORT, limits: Limits = Limits(), sysfs_root: str = "/sys",
          proc_net: str = "/proc/net") -> ProbeResult:
    """Measure the TCP throughput to a `--link-serve` peer; ProbeError (one line) when it cannot."""
    what = hostport(peer, port)
    start = time.monotonic()
    setup_deadline = start + SETUP_TIMEOUT
    family, sockaddr = _resolve(peer, port, setup_deadline)
    control = _connect(sockaddr, family, setup_deadline, what)
    address, local = control.getpeername()[0], control.getsockname()[0]
    data: list[socket.socket] = []
    try:
        granted, token = _hello(control, limits, setup_deadline, what)
        for _ in range(granted.streams):
            data.append(_connect(sockaddr, family, setup_deadline, what))
            try:
                data[-1].sendall(token.encode() + b"\n")
            except OSError as exc:
                raise ProbeError(f"{what} dropped a data stream while it opened ({exc})") from None
        try:
            go = read_json(control, setup_deadline)
        except (socket.timeout, ValueError, OSError) as exc:
            raise ProbeError(f"{what} did not start the transfer within {SETUP_TIMEOUT:g} s ({exc})") from None
        if go.get("go") is not True:
            raise ProbeError(f"{what} did not start the transfer: {go.get('error', go)}")
        budget, ended = _send_all(data, granted)
        if ended == "stalled":
            raise ProbeError(f"the transfer to {what} stalled: no byte accepted for {STALL_SECONDS:g} s "
                             "(the peer stopped reading or the path dropped)")
        got, window = _report(control, what, ended)
    finally:
        for s in (control, *data):
            s.close()

    interface, route = route_interface(address, local, proc_net)
    rate, unknown = negotiated_rate(interface, sysfs_root)
    return ProbeResult(peer=peer, address=address, port=port, interface=interface, route=route,
                       streams=granted.streams, seconds_limit=granted.seconds, bytes_limit=granted.bytes,
                       bytes=got, seconds=window, sent_bytes=budget.moved, wall_seconds=time.monotonic() - start,
                       ended=ended, achieved_bytes_per_second=got / window if window > 0 else 0.0,
                       negotiated_bytes_per_second=rate, negotiated_unknown=unknown)


def _hello(control: socket.socket, limits: Limits, deadline: float, what: str) -> tuple[Limits, str]:
    """Ask for `limits`; the limits granted (never above ours) and the token the data streams present."""
    try:
        send_json(control, {"probe": PROTOCOL, "streams": limits.streams, "seconds": limits.seconds,
                             "bytes": limits.bytes})
        answer = read_json(control, deadline)
    except socket.timeout:
        raise ProbeError(f"{what} accepted the connection but did not answer within {SETUP_TIMEOUT:g} s: "
                         "is `vllm-spark doctor --link-serve` what listens there?") from None
    except (ValueError, OSError) as exc:
        raise ProbeError(f"{what} is not a vllm-spark link server ({exc})") from None
    if answer.get("ok") is not True:
        raise ProbeError(f"{what} declined the probe: {answer.get('error', answer)}")
    try:
        granted = limits.within(Limits(float(answer["seconds"]), int(answer["bytes"]), int(answer["streams"])))
        return granted, str(answer["token"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProbeError(f"{what} answered limits this probe cannot use: {exc}") from None


def _send_all(data: list[socket.socket], limits: Limits) -> tuple[Budget, str]:
    """Zeros on every stream until the time limit, the byte limit or a stall; then end-of-stream on each.
    (The shared budget, why it ended: "byte limit", "time limit", "stalled" or "peer closed (...)".)"""
    zeros = _Zeros()
    budget = Budget(limits.bytes, time.monotonic)
    deadline = time.monotonic() + limits.seconds
    outcomes: list[str] = []
    senders = [threading.Thread(target=_send_until, args=(s, zeros, budget, deadline, outcomes), daemon=True)
               for s in data]
    try:
        for t in senders:
            t.start()
        for t in senders:   # each looks at the clock at least every POLL_SECONDS
            t.join(max(0.0, deadline - time.monotonic()) + STALL_SECONDS + 1)
    finally:
        zeros.close()
    for s in data:
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    if budget.exhausted:
        return budget, "byte limit"
    for why in ("stalled", "time limit"):
        if why in outcomes:
            return budget, why
    return budget, next(iter(outcomes), "peer closed")


def _report(control: socket.socket, what: str, ended: str) -> tuple[int, float]:
    """The server's count: (bytes it received, the seconds they took)."""
    try:
        report = read_json(control, time.monotonic() + REPORT_TIMEOUT)
        return int(report["bytes"]), float(report["seconds"])
    except (socket.timeout, ValueError, OSError) as exc:
        raise ProbeError(f"{what} sent no report within {REPORT_TIMEOUT:g} s after the transfer "
                         f"({ended}; {exc})") from None
    except (KeyError, TypeError) as exc:
        raise ProbeError(f"{what} sent a report without bytes and seconds: {exc}") from None


# -- the command line ---------------------------------------------------------------------------------

LOW_SHARE = 0.25   # below this share of the negotiated rate the probe warns (VllmSparkLinkBelowRate's default share)


def _amount(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _gbit(bytes_per_second: float) -> str:
    return f"{bytes_per_second * 8 / 1e9:.2f} Gb/s"


def result_check(r: ProbeResult):
    """The probe's verdict in doctor's shape: ok, warn (far below the negotiated rate) or info (rate unknown)."""
    from vllm_spark_plugin.doctor import links
    from vllm_spark_plugin.doctor.check import INFO, OK, WARN, Check

    over = f"over {r.interface}" if r.interface else "over an unknown interface"
    detail = (f"{hostport(r.peer, r.port)} ({r.address}) {over} ({r.route}): {r.streams} stream(s) moved "
              f"{_amount(r.bytes)} in {r.seconds:.2f} s (ended by {r.ended}; limits {r.seconds_limit:g} s, "
              f"{_amount(r.bytes_limit)}): {_gbit(r.achieved_bytes_per_second)}")
    if r.share is None:
        return Check("link_probe", INFO, f"{detail}; negotiated rate unknown: {r.negotiated_unknown}")
    detail += f", {r.share:.0%} of {r.interface}'s negotiated {_gbit(r.negotiated_bytes_per_second)}"
    if r.share >= LOW_SHARE:
        return Check("link_probe", OK, detail)
    return Check("link_probe", WARN, detail + f": under {LOW_SHARE:.0%}",
                 f"first run `vllm-spark doctor --link-probe 127.0.0.1` against a local `--link-serve` on each host: "
                 f"that is the probe's own ceiling there (if it is as low, the host's CPU is the bound, not the link); "
                 f"then {links.DIAGNOSIS}")


def run_probe(endpoint: str, limits: Limits, as_json: bool = False, sysfs_root: str = "/sys") -> int:
    """`--link-probe HOST[:PORT]`: 0 measured (ok, warn or info), 1 could not measure, 2 bad arguments,
    130 interrupted."""
    from vllm_spark_plugin.doctor import format_checks

    try:
        host, port = parse_endpoint(endpoint)
    except ValueError as exc:
        print(f"vllm-spark doctor: error: --link-probe: {exc}", file=sys.stderr)
        return 2
    try:
        result = probe(host, port, limits, sysfs_root=sysfs_root)
    except KeyboardInterrupt:
        print("vllm-spark doctor: link probe interrupted (ctrl-c)", file=sys.stderr)
        return 130
    except ProbeError as exc:
        print(f"vllm-spark doctor: link probe failed: {exc}", file=sys.stderr)
        if as_json:
            print(json.dumps({"ok": False, "error": str(exc)}, indent=2))
        return 1
    check = result_check(result)
    if as_json:
        print(json.dumps({"ok": True, "probe": result.as_dict(), "checks": [asdict(check)]}, indent=2))
    else:
        print(format_checks([check]))
    return 0


def run_serve(endpoint: str, limits: Limits, count: int = 1) -> int:
    """`--link-serve [ADDR:]PORT`: serve `count` probes (0: until ctrl-c); 1 when it cannot listen."""
    try:
        host, port = parse_endpoint(endpoint, default_host="")
        server = LinkServer(host, port, limits)
    except (ValueError, OSError) as exc:
        print(f"vllm-spark doctor: error: --link-serve {endpoint}: {getattr(exc, 'strerror', None) or exc}",
              file=sys.stderr)
        return 1 if isinstance(exc, OSError) else 2
    addr, bound = server.address
    until = "until ctrl-c" if count == 0 else f"exits after {count} probe(s), ctrl-c to stop"
    print(f"vllm-spark doctor: link server on {hostport(addr, bound)} (each probe at most {limits.seconds:g} s, "
          f"{_amount(limits.bytes)}, {limits.streams} streams; {until})", flush=True)

    def log(line: str) -> None:
        print(f"vllm-spark doctor: {line}", flush=True)

    try:
        served = server.serve(count, log=log)
    except KeyboardInterrupt:
        print("vllm-spark doctor: link server stopped (ctrl-c)", flush=True)
        return 0
    finally:
        server.close()
    print(f"vllm-spark doctor: link server done after {served} probe(s)", flush=True)
    return 0


def _ranged(kind, low, high, what: str):
    """An argparse type: a `kind` in [low, high], or one line saying what was expected."""
    def parse(text: str):
        import argparse
        try:
            v = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{what}: {exc}") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{what} must be in [{low:g}, {high:g}], got {text!r}")
        return v
    return parse


def add_arguments(parser) -> None:
    g = parser.add_argument_group("link probe (opt-in, bounded: measures the TCP throughput between two hosts)")
    g.add_argument("--link-probe", metavar="HOST[:PORT]",
                   help=f"measure the throughput to HOST (port {DEFAULT_PORT} unless given), where "
                        "`vllm-spark doctor --link-serve` runs, against the negotiated rate of the interface the "
                        "route uses; exit 1 when the peer is unreachable, refuses or stalls")
    g.add_argument("--link-serve", metavar="[ADDR:]PORT", nargs="?", const=str(DEFAULT_PORT),
                   help=f"serve link probes on ADDR:PORT (default all addresses, port {DEFAULT_PORT}), one at a "
                        "time, under the --link-* limits")
    g.add_argument("--link-seconds", type=_ranged(float, 0.1, MAX_SECONDS, "--link-seconds"), default=DEFAULT_SECONDS,
                   help=f"the most seconds of traffic (default {DEFAULT_SECONDS:g}, at most {MAX_SECONDS:g}; the "
                        f"whole probe ends within this + {SETUP_TIMEOUT + REPORT_TIMEOUT:g} s)")
    g.add_argument("--link-bytes", type=_ranged(parse_size, 1, MAX_BYTES, "--link-bytes"), default=DEFAULT_BYTES,
                   metavar="SIZE", help="the most bytes sent, all streams together (default 1G, at most 16G)")
    g.add_argument("--link-streams", type=_ranged(int, 1, MAX_STREAMS, "--link-streams"), default=None,
                   help=f"parallel TCP streams (probe default {DEFAULT_STREAMS}; a server accepts up to "
                        f"this, default {MAX_STREAMS})")
    g.add_argument("--link-serve-count", type=_ranged(int, 0, 1 << 30, "--link-serve-count"), default=1,
                   metavar="N", help="with --link-serve: exit after N probes (default 1; 0: until ctrl-c)")


def run(args) -> int:
    """The probe or the server, from doctor's parsed arguments."""
    if args.link_probe and args.link_serve:
        print("vllm-spark doctor: error: --link-probe and --link-serve are two ends: run one on each host",
              file=sys.stderr)
        return 2
    serving = bool(args.link_serve)
    streams = args.link_streams or (MAX_STREAMS if serving else DEFAULT_STREAMS)
    limits = Limits(float(args.link_seconds), int(args.link_bytes), int(streams))
    if serving:
        return run_serve(args.link_serve, limits, args.link_serve_count)
    return run_probe(args.link_probe, limits, as_json=args.json)
