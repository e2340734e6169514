"""The link series from real traffic on a real interface: a veth pair with one end in a network
namespace this test creates (and removes), 8 MiB of TCP each way between a socket in the namespace
and one here, a link the test takes down and up.  The interface is followed the way a user would:
SPARK_PLUGIN_LINKS names it.  Bounded: one pair, 16 MiB, 20 s.

Needs root (ip netns, ip link) and a kernel with network namespaces; skipped only without the latter.
"""
from __future__ import annotations

import ipaddress
import json
import os
import secrets
import socket
import subprocess
import sys
import time

import pytest

from vllm_spark_plugin import settings
from vllm_spark_plugin.common import link_sources as ls
from vllm_spark_plugin.metrics.link_telemetry import LinkTelemetry

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/ns/net"),
                                reason="this kernel has no network namespaces (no /proc/self/ns/net)")
PAYLOAD = 8 << 20
DEADLINE_SECONDS = 20.0
PORT = 5201

# Runs inside the namespace: take one connection, read PAYLOAD bytes, send PAYLOAD back, exit.
SERVER = """
import socket, sys
addr, size, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
srv = socket.create_server((addr, %d))
srv.settimeout(limit)
print("ready", flush=True)
conn, _ = srv.accept()
conn.settimeout(limit)
got = 0
while got < size:
    chunk = conn.recv(1 << 20)
    if not chunk:
        sys.exit(1)
    got += len(chunk)
conn.sendall(b"y" * size)
conn.close()
""" % PORT


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


def free_slash30() -> ipaddress.IPv4Network:
    """A random 10.x.y.z/30 that no route of this machine covers."""
    taken = []
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        try:
            taken.append(ipaddress.ip_network(route.get("dst", ""), strict=False))
        except ValueError:
            pass  # "default", or none
    for _ in range(50):
        net = ipaddress.ip_network(f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}.{4 * secrets.randbelow(64)}/30")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise AssertionError("no free 10.x.y.z/30 found")


class VethPair:
    """`host` in this namespace, `peer` in a new namespace `ns`; addresses .1 (host) and .2 (peer)."""

    def __init__(self) -> None:
        tag = "vsp" + secrets.token_hex(3)
        self.ns, self.host, self.peer = tag, tag + "h", tag + "p"
        net = free_slash30()
        self.host_ip, self.peer_ip = (str(a) for a in list(net.hosts())[:2])
        self.prefix = net.prefixlen
        self.server: subprocess.Popen | None = None

    def open(self) -> "VethPair":
        ip("netns", "add", self.ns)
        ip("link", "add", self.host, "type", "veth", "peer", "name", self.peer)
        ip("link", "set", self.peer, "netns", self.ns)
        ip("addr", "add", f"{self.host_ip}/{self.prefix}", "dev", self.host)
        ip("-n", self.ns, "addr", "add", f"{self.peer_ip}/{self.prefix}", "dev", self.peer)
        ip("-n", self.ns, "link", "set", "lo", "up")
        ip("-n", self.ns, "link", "set", self.peer, "up")
        ip("link", "set", self.host, "up")
        wait_for(lambda: read(self.host, "operstate") == "up", f"{self.host} up")
        return self

    def start_server(self) -> None:
        self.server = subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, "-c", SERVER,
                                        self.peer_ip, str(PAYLOAD), str(DEADLINE_SECONDS)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.server.stdout.readline().strip() == "ready", self.server.stderr.read()

    def close(self) -> None:
        """Idempotent: stop the server, delete the pair (deleting one end deletes both) and the namespace."""
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
        if self.server is not None:
            self.server.wait(timeout=10)
            self.server.stdout.close()
            self.server.stderr.close()
            self.server = None
        ip("link", "del", self.host, check=False)
        ip("netns", "del", self.ns, check=False)


def read(interface: str, name: str) -> str | None:
    try:
        with open(f"/sys/class/net/{interface}/{name}") as fh:
            return fh.read().strip()
    except OSError:
        return None


def wait_for(cond, what: str, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def exchange(pair: VethPair) -> None:
    """PAYLOAD bytes to the namespace and PAYLOAD back, over real TCP through the veth pair."""
    pair.start_server()
    with socket.create_connection((pair.peer_ip, PORT), timeout=DEADLINE_SECONDS) as conn:
        conn.sendall(b"x" * PAYLOAD)
        got = 0
        while got < PAYLOAD:
            chunk = conn.recv(1 << 20)
            assert chunk, f"the namespace's server closed after {got} bytes"
            got += len(chunk)
    assert pair.server.wait(timeout=DEADLINE_SECONDS) == 0, pair.server.stderr.read()


@pytest.fixture
def pair():
    p = VethPair().open()
    try:
        yield p
    finally:
        p.close()


def test_veth_counters_rate_and_carrier_changes_from_real_traffic(fresh, pair):
    started = time.monotonic()
    setting = settings.load({"SPARK_PLUGIN_LINKS": pair.host}, announce=False)
    assert setting.links == pair.host and not setting.problems
    ins = fresh.exporter("links-veth").ins
    t = LinkTelemetry(ins, setting.links, environ={})
    # Read before the baseline: the kernel sends on its own (IPv6 solicitations) between any two reads,
    # so only a count taken before the baseline bounds the delta from above.
    sent_before = int(read(pair.host, "statistics/tx_bytes"))
    t.sample(None)                                           # the baseline
    assert fresh.sample("vllm_spark_link_up", interface=pair.host) == 1
    assert fresh.sample("vllm_spark_link_rate_bytes_per_second", interface=pair.host) == 10_000e6 / 8  # veth: 10000 Mb/s
    assert fresh.values("vllm_spark_link_info", interface=pair.host) == [
        ({"interface": pair.host, "counter_source": "netdev", "rdma_device": "none", "driver": "none"}, 1.0)]

    exchange(pair)
    t.sample(None)
    tx = fresh.sample("vllm_spark_link_transmit_bytes_total", interface=pair.host)
    rx = fresh.sample("vllm_spark_link_receive_bytes_total", interface=pair.host)
    assert tx >= PAYLOAD and rx >= PAYLOAD, (tx, rx)
    assert tx <= int(read(pair.host, "statistics/tx_bytes")) - sent_before  # deltas, not totals since boot

    ip("link", "set", pair.host, "down")
    wait_for(lambda: read(pair.host, "operstate") == "down", f"{pair.host} down")
    t.sample(None)
    assert fresh.sample("vllm_spark_link_up", interface=pair.host) == 0
    assert fresh.registry.get_sample_value("vllm_spark_link_rate_bytes_per_second", {"interface": pair.host}) is None
    ip("link", "set", pair.host, "up")
    wait_for(lambda: read(pair.host, "operstate") == "up", f"{pair.host} up again")
    t.sample(None)
    assert fresh.sample("vllm_spark_link_carrier_changes_total", interface=pair.host) == 2   # down, then up
    assert fresh.sample("vllm_spark_link_up", interface=pair.host) == 1
    assert fresh.errors_total() == 0

    pair.close()                                             # everything the test made is gone
    assert ip("link", "show", pair.host, check=False).returncode != 0
    assert pair.ns not in ip("netns", "list").stdout
    t.sample(None)                                           # and the followed link now reads as absent
    assert fresh.sample("vllm_spark_link_up", interface=pair.host) == 0
    assert not ls.read_link(pair.host).exists
    assert time.monotonic() - started < DEADLINE_SECONDS
