"""`vllm-spark doctor --link-probe` against `--link-serve` across a real link: two network namespaces
joined by a veth pair that this module creates and removes (names `vsp` + random, a random 10.x.y.0/30).

Real sockets and real traffic: the probe runs in one namespace, the server in the other, each as the
`vllm-spark doctor` command.  The probe's side of the veth is shaped with `tc ... tbf rate 200mbit`,
so the achieved rate has a known bound, and its transmit counter shows what really crossed the link:
never more than the byte limit, nor more than the shaped rate allows in the time limit.  The failure
cases (refused, unreachable, a server that stops reading mid-transfer) end with one line, in bounded
time.  Needs root (namespaces, tc); skipped, saying why, where that is missing.  About 20 s.
"""
from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from vllm_spark_plugin.doctor import link_wire as wire

SHAPED_BYTES_PER_SECOND = 200e6 / 8   # tbf rate 200mbit on the probe's side
TBF_BURST = 256 * 1024
VETH_RATE = 10_000e6 / 8              # what a veth reports as its speed (10000 Mb/s)
PY = [sys.executable, "-m", "vllm_spark_plugin.cli", "doctor"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


@dataclass
class Pair:
    ns_a: str
    ns_b: str
    dev_a: str
    dev_b: str
    addr_a: str
    addr_b: str
    unrouted: str   # an address A routes to B, which does not forward it: packets vanish

    def tx_bytes(self) -> int:
        counter = f"/sys/class/net/{self.dev_a}/statistics/tx_bytes"   # this namespace's sysfs
        out = subprocess.run(["ip", "netns", "exec", self.ns_a, "cat", counter], capture_output=True, text=True,
                             timeout=10, check=True)
        return int(out.stdout)


@pytest.fixture(scope="module")
def pair():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("needs root, ip and tc to create network namespaces and shape a veth")
    tag = secrets.token_hex(3)
    x, y = secrets.randbelow(200) + 20, secrets.randbelow(250)
    p = Pair(f"vsp{tag}a", f"vsp{tag}b", f"vsp{tag}0", f"vsp{tag}1", f"10.{x}.{y}.1", f"10.{x}.{y}.2",
             f"10.{x}.{(y + 1) % 256}.5")
    made = []
    try:
        for ns in (p.ns_a, p.ns_b):
            got = _ip("netns", "add", ns, check=False)
            if got.returncode:
                pytest.skip(f"cannot create a network namespace here: {got.stderr.strip()}")
            made.append(ns)
        _ip("link", "add", p.dev_a, "netns", p.ns_a, "type", "veth", "peer", "name", p.dev_b, "netns", p.ns_b)
        for ns, dev, addr in ((p.ns_a, p.dev_a, p.addr_a), (p.ns_b, p.dev_b, p.addr_b)):
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", p.ns_a, "route", "add", p.unrouted.rsplit(".", 1)[0] + ".0/24", "via", p.addr_b)
        subprocess.run(["ip", "netns", "exec", p.ns_a, "tc", "qdisc", "add", "dev", p.dev_a, "root", "tbf",
                        "rate", "200mbit", "burst", "256kb", "latency", "50ms"], check=True, timeout=10,
                       capture_output=True)
        yield p
    finally:
        for ns in made:   # deleting a namespace deletes its end of the veth, and with it the pair
            _ip("netns", "del", ns, check=False)
        assert not any(ns in _ip("netns", "list").stdout for ns in made)


@contextmanager
def serving(ns: str, endpoint: str, *args: str):
    """`vllm-spark doctor --link-serve ENDPOINT ...` in namespace `ns`, ready when it says where it listens."""
    proc = subprocess.Popen(["ip", "netns", "exec", ns, *PY, "--link-serve", endpoint, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        first = lines.get(timeout=30)
        assert first.startswith("vllm-spark doctor: link server on "), first
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(10)


def probing(ns: str, endpoint: str, *args: str, timeout: float = 60):
    """`vllm-spark doctor --link-probe ENDPOINT --json ...` in namespace `ns`: (rc, report or None, stderr, wall s)."""
    t0 = time.monotonic()
    done = subprocess.run(["ip", "netns", "exec", ns, *PY, "--link-probe", endpoint, "--json", *args],
                          capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None, done.stderr, wall


def test_the_time_limit_holds_and_the_rate_is_the_shaped_links(pair):
    before = pair.tx_bytes()
    with serving(pair.ns_b, f"{pair.addr_b}:7481"):
        rc, out, err, wall = probing(pair.ns_a, pair.addr_b + ":7481", "--link-seconds", "3")
    sent = pair.tx_bytes() - before
    assert rc == 0, err
    r = out["probe"]
    assert r["interface"] == pair.dev_a and r["route"] == "/proc/net/route" and r["address"] == pair.addr_b
    assert r["negotiated_bytes_per_second"] == VETH_RATE and r["streams"] == wire.DEFAULT_STREAMS
    assert r["ended"] == "time limit" and r["seconds_limit"] == 3 and 2.5 < r["seconds"] <= 3.0
    assert wall < 3 + wire.SETUP_TIMEOUT + wire.REPORT_TIMEOUT and r["wall_seconds"] < wall
    # below the shaped rate (tbf's burst is the only credit), above 40% of it
    assert 0.4 * SHAPED_BYTES_PER_SECOND < r["achieved_bytes_per_second"] <= SHAPED_BYTES_PER_SECOND + TBF_BURST / 3
    # what crossed the veth: all the server counted, and no more than the shaped rate allows in the limit
    assert r["bytes"] <= sent <= SHAPED_BYTES_PER_SECOND * (3 + 0.5) + TBF_BURST
    assert r["sent_bytes"] >= r["bytes"]
    check = out["checks"][0]   # 0.2 of 10 Gb/s negotiated: the probe warns
    assert check["status"] == "warn" and f"over {pair.dev_a}" in check["detail"] and "under 25%" in check["detail"]


def test_the_byte_limit_holds_on_the_wire(pair):
    before = pair.tx_bytes()
    with serving(pair.ns_b, f"{pair.addr_b}:7482"):
        rc, out, err, _ = probing(pair.ns_a, pair.addr_b + ":7482", "--link-bytes", "4M", "--link-streams", "3")
    sent = pair.tx_bytes() - before
    assert rc == 0, err
    r = out["probe"]
    assert r["bytes"] == r["sent_bytes"] == 4 << 20 and r["ended"] == "byte limit" and r["streams"] == 3
    assert 4 << 20 <= sent <= (4 << 20) * 1.1 + 64 * 1024   # payload plus TCP/IP headers, nothing more


def test_the_servers_limits_bound_any_probe(pair):
    with serving(pair.ns_b, f"{pair.addr_b}:7483", "--link-seconds", "1", "--link-bytes", "2M",
                 "--link-streams", "2") as (proc, lines):
        rc, out, err, _ = probing(pair.ns_a, pair.addr_b + ":7483")   # asks for 10 s, 1 GiB, 4 streams
        assert proc.wait(10) == 0   # --link-serve-count 1: done after one probe
    assert rc == 0, err
    r = out["probe"]
    assert (r["seconds_limit"], r["bytes_limit"], r["streams"]) == (1, 2 << 20, 2)
    assert r["bytes"] <= 2 << 20 and r["seconds"] <= 1.0
    said = [lines.get_nowait() for _ in range(lines.qsize())]
    assert any(line.startswith(f"vllm-spark doctor: probe from {pair.addr_a}: 2 stream(s)") for line in said), said


def test_a_loopback_probe_reports_the_hosts_own_ceiling(pair):
    with serving(pair.ns_a, "127.0.0.1:7484"):
        rc, out, err, _ = probing(pair.ns_a, "127.0.0.1:7484", "--link-seconds", "1", "--link-bytes", "64M")
    assert rc == 0, err
    r, check = out["probe"], out["checks"][0]
    assert r["interface"] == "lo" and r["negotiated_bytes_per_second"] is None and r["bytes"] <= 64 << 20
    assert check["status"] == "info" and "host's own ceiling" in check["detail"]


def test_a_refused_probe_fails_at_once_in_one_line(pair):
    rc, out, err, wall = probing(pair.ns_a, pair.addr_b + ":7485")
    assert rc == 1 and out == {"ok": False, "error": err.split("link probe failed: ", 1)[1].strip()}
    assert err.count("\n") == 1 and "refused the connection" in err and wall < 5


def test_an_unreachable_peer_fails_within_the_setup_timeout(pair):
    rc, _, err, wall = probing(pair.ns_a, pair.unrouted + ":7486")
    assert rc == 1 and err.count("\n") == 1
    assert f"cannot reach {pair.unrouted}:7486: no answer to the connection within {wire.SETUP_TIMEOUT:g} s" in err
    assert wall < wire.SETUP_TIMEOUT + 3


def test_a_server_that_stops_reading_is_a_stall_not_a_hang(pair):
    with serving(pair.ns_b, f"{pair.addr_b}:7487") as (server, _):
        t0 = time.monotonic()
        probe = subprocess.Popen(["ip", "netns", "exec", pair.ns_a, *PY, "--link-probe", pair.addr_b + ":7487",
                                  "--link-seconds", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1.5)
            server.send_signal(signal.SIGSTOP)   # the kernel still takes what fits its buffers, then nothing
            _, err = probe.communicate(timeout=wire.STALL_SECONDS + wire.REPORT_TIMEOUT + 5)
        finally:
            if probe.poll() is None:
                probe.kill()
            server.send_signal(signal.SIGCONT)
    assert probe.returncode == 1 and err.count("\n") == 1
    assert f"stalled: no byte accepted for {wire.STALL_SECONDS:g} s" in err
    assert time.monotonic() - t0 < 1.5 + wire.STALL_SECONDS + 4   # far inside the 20 s asked for
