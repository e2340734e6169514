"""`vllm-spark doctor`'s link checks (vllm_spark_plugin/doctor/links.py) on recorded DGX Spark sysfs trees,
and the link probe's parts that need no second host (vllm_spark_plugin/doctor/link_probe.py, the probe;
link_server.py, the server; link_wire.py, what both share; on loopback).

Each fault is a case of tests/fixtures/links/doctor/cases.json applied to a copy of the recorded Spark
tree (tests/fixtures/links/spark/sys); the README beside it names each value's source.  The seams are
the ones the checks document: `Probe.extra["sysfs_root"]`, `["kernel_log_path"]`, `["port_rate"]`,
`["gpu_count"]`.  The probe between two network namespaces is tests/integration/test_link_probe_netns.py.
"""
from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import types
from pathlib import Path

import pytest

from vllm_spark_plugin import doctor
from vllm_spark_plugin.common import units
from vllm_spark_plugin.doctor import link_probe as lp
from vllm_spark_plugin.doctor import link_wire as wire
from vllm_spark_plugin.doctor import links
from vllm_spark_plugin.doctor.link_server import LinkServer
from support.link_tree import SPARK_SYS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "links"
CASES = json.loads((FIXTURES / "doctor" / "cases.json").read_text())
SPARK_PORT = 200e9 / 8   # the Spark's ConnectX-7 ports are 200 GbE: the best rate `ethtool` lists there
TP2 = ["serve", "m", "--tensor-parallel-size", "2"]   # two Sparks: one GPU each
SEED_DIAGNOSIS = ("ib_write_bw", "firmware version", "reboot with the cables connected")


def tree(tmp_path: Path, case: str | None) -> Path:
    """A copy of the recorded Spark tree with `case` applied (None: the tree as recorded)."""
    root = tmp_path / "sys"
    shutil.copytree(SPARK_SYS, root, symlinks=True)
    spec = CASES[case] if case else {}
    for rel, value in spec.get("write", {}).items():
        target = root / rel
        assert target.resolve().is_relative_to(root.resolve()) and target.exists(), rel
        target.write_text(value + "\n")
    for rel in spec.get("remove", []):
        target = root / rel
        target.unlink() if target.is_symlink() else shutil.rmtree(target)
    return root


def run(tmp_path, case="healthy", env=None, argv=TP2, kernel_log="clean-boot.kmsg", port_rate=SPARK_PORT,
        setting="auto", gpus=None) -> dict:
    extra = {"sysfs_root": str(tree(tmp_path, case)), "port_rate": lambda _iface: port_rate,
             "kernel_log_path": str(FIXTURES / "doctor" / kernel_log) if kernel_log else str(tmp_path / "no-kmsg")}
    if gpus is not None:
        extra["gpu_count"] = gpus
    probe = types.SimpleNamespace(extra=extra)
    return {c.name: c for c in links.checks(env or {}, doctor.parse_serve_args(list(argv)), probe, setting)}


# --- single box ---------------------------------------------------------------------------------------
def test_a_single_box_is_one_not_applicable(tmp_path):
    checks = run(tmp_path, "no_rdma", argv=["serve", "m"])
    assert list(checks) == ["links"]
    c = checks["links"]
    assert c.status == doctor.NA and c.detail.startswith("single box: no link to check (no RDMA device")
    assert doctor.format_checks([c]).splitlines()[0].startswith("[ n/a] links: single box")


def test_links_off_on_a_single_box_is_not_applicable(tmp_path):
    checks = run(tmp_path, "healthy", argv=["serve", "m"], setting="off")
    assert list(checks) == ["links"] and "SPARK_PLUGIN_LINKS=off" in checks["links"].detail


def test_a_healthy_two_spark_deployment_passes_every_check(tmp_path):
    checks = run(tmp_path, "healthy", env={"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "NCCL_IB_HCA": "=mlx5_0"})
    assert set(checks) == {"link_named", "link_rdma", "link_rate", "link_pcie", "link_flaps"}
    assert {c.status for c in checks.values()} == {doctor.OK}, [(c.name, c.detail) for c in checks.values()]
    assert checks["link_rate"].detail == "enp1s0f0np0 200 Gb/s of 200 Gb/s"   # NCCL_IB_HCA: the one HCA followed


def test_an_uncabled_port_is_reported_not_a_fault(tmp_path):
    c = run(tmp_path, "healthy")["link_rate"]
    assert c.status == doctor.OK and "enp1s0f1np1 down (no cable, or the peer is off)" in c.detail


# --- is it multi-node? --------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, gpus, expected", [
    (["serve", "m"], 1, None),
    (["serve", "m", "-tp", "2"], 1, "--tensor-parallel-size 2 x --pipeline-parallel-size 1 = 2 GPUs, this box has 1"),
    (["serve", "m", "-tp", "2"], 2, None),                      # two GPUs in one box
    (["serve", "m", "--pipeline-parallel-size=4"], 1, "--tensor-parallel-size 1 x --pipeline-parallel-size 4"),
    (["serve", "m", "--nnodes", "2", "--node-rank", "1"], 8, "--nnodes 2"),
    (["serve", "m", "--headless", "--data-parallel-start-rank", "1"], 1, "--headless"),
    (["serve", "m", "-dp", "4", "-dpl", "2", "-dpa", "10.0.0.1"], 2, "--data-parallel-address 10.0.0.1"),
    (["serve", "m", "-dp", "2", "--data-parallel-size-local", "1"], 1, "--data-parallel-size-local 1 of"),
    (["serve", "m", "--distributed-executor-backend", "ray"], 1, None),   # Ray alone runs on one box too
])
def test_multi_node_is_read_from_the_serve_arguments(argv, gpus, expected):
    got = links.multi_node(doctor.parse_serve_args(argv).argv, gpus)
    assert (got is None) if expected is None else (got is not None and got.startswith(expected)), got


def test_gpu_count_seam_makes_tp2_fit_one_box(tmp_path):
    checks = run(tmp_path, "no_rdma", argv=TP2, gpus=2)
    assert list(checks) == ["links"]


# --- link_named ---------------------------------------------------------------------------------------
def test_an_nccl_interface_that_does_not_exist_fails(tmp_path):
    c = run(tmp_path, env={"NCCL_SOCKET_IFNAME": "enp9s0"})["link_named"]
    assert c.status == doctor.FAIL
    assert c.detail.startswith("NCCL_SOCKET_IFNAME='enp9s0': no interface starting with enp9s0 (interfaces here: ")
    assert "ibdev2netdev" in c.fix


def test_an_nccl_interface_that_is_down_fails(tmp_path):
    c = run(tmp_path, env={"NCCL_SOCKET_IFNAME": "=enp1s0f1np1"})["link_named"]
    assert c.status == doctor.FAIL and "enp1s0f1np1 is down" in c.detail and "ip link set IF up" in c.fix


def test_an_nccl_prefix_passes_when_one_match_is_up(tmp_path):
    c = run(tmp_path, env={"NCCL_SOCKET_IFNAME": "enp1"})["link_named"]   # NCCL: plain names are prefixes
    assert c.status == doctor.OK and "enp1s0f0np0 is up, enp1s0f1np1 is down" in c.detail


def test_an_rdma_device_named_in_nccl_ib_hca_that_is_absent_or_down_fails(tmp_path):
    c = run(tmp_path, env={"NCCL_IB_HCA": "=mlx5_7"})["link_named"]
    assert c.status == doctor.FAIL
    assert "no RDMA device named mlx5_7 (RDMA devices here: mlx5_0, mlx5_1, roceP2p1s0f0)" in c.detail
    c = run(tmp_path / "b", env={"NCCL_IB_HCA": "mlx5_1:1"})["link_named"]
    assert c.status == doctor.FAIL and "mlx5_1 port 1 (enp1s0f1np1) is down" in c.detail
    c = run(tmp_path / "c", env={"NCCL_IB_HCA": "mlx5_0:2"})["link_named"]
    assert c.status == doctor.FAIL and "mlx5_0 has no port 2" in c.detail


def test_gloo_and_the_links_setting_name_exact_interfaces(tmp_path):
    c = run(tmp_path, env={"GLOO_SOCKET_IFNAME": "enp1s0f0"})["link_named"]   # Gloo: exact names
    assert c.status == doctor.FAIL and "no interface named enp1s0f0" in c.detail
    c = run(tmp_path / "b", setting="enp1s0f0np0,enp7s0")["link_named"]
    assert c.status == doctor.FAIL
    assert c.detail.startswith("SPARK_PLUGIN_LINKS='enp1s0f0np0,enp7s0': no interface named enp7s0")


def test_an_exclusion_list_is_not_checked(tmp_path):
    c = run(tmp_path, env={"NCCL_SOCKET_IFNAME": "^docker,lo"})["link_named"]
    assert c.status == doctor.OK and "an exclusion list: not checked" in c.detail


def test_multi_node_without_any_interface_variable_is_told_to_set_one(tmp_path):
    c = run(tmp_path)["link_named"]
    assert c.status == doctor.INFO and "may choose the management port" in c.detail
    assert "NCCL_SOCKET_IFNAME" in c.fix


# --- link_rdma ----------------------------------------------------------------------------------------
def test_no_rdma_device_on_a_multi_node_deployment_warns(tmp_path):
    c = run(tmp_path, "no_rdma", env={"NCCL_SOCKET_IFNAME": "enp1s0f0np0"})["link_rdma"]
    assert c.status == doctor.WARN
    assert c.detail.startswith("multi-node (--tensor-parallel-size 2 x --pipeline-parallel-size 1 = 2 GPUs, this box "
                               "has 1) but ") and "lists no RDMA device" in c.detail
    assert "modprobe mlx5_ib" in c.fix


def test_rdma_devices_on_a_multi_node_deployment_pass_and_are_listed(tmp_path):
    c = run(tmp_path)["link_rdma"]
    assert c.status == doctor.OK and "mlx5_0 port 1 (enp1s0f0np0)" in c.detail


def test_the_rdma_check_is_not_applicable_on_one_box(tmp_path):
    c = run(tmp_path, argv=["serve", "m"])["link_rdma"]
    assert c.status == doctor.NA and "this box alone" in c.detail


# --- link_rate ----------------------------------------------------------------------------------------
def test_a_link_negotiated_below_its_port_rate_warns_with_the_seed_diagnosis(tmp_path):
    c = run(tmp_path, "rate_below_port")["link_rate"]
    assert c.status == doctor.WARN
    assert "enp1s0f0np0 negotiated 100 Gb/s, its port supports 200 Gb/s" in c.detail
    assert c.fix.startswith("enp1s0f0np0: reseat or replace the cable")
    assert all(step in c.fix for step in SEED_DIAGNOSIS) and "ib_write_bw -d mlx5_0" in c.fix


def test_an_unknown_port_rate_is_said_not_judged(tmp_path):
    c = run(tmp_path, "rate_below_port", port_rate=None)["link_rate"]
    assert c.status == doctor.INFO and "the port's best rate unknown" in c.detail


# --- link_pcie ----------------------------------------------------------------------------------------
def test_a_nic_on_a_narrower_pcie_link_warns(tmp_path):
    c = run(tmp_path, None)["link_pcie"]   # the recorded tree: the GX10's second function at x2
    assert c.status == doctor.WARN
    assert ("enP2p1s0f0np0 (0002:01:00.0): PCIe 32.0 GT/s x2, the function supports 32.0 GT/s x4 "
            "(about 63 of 126 Gb/s)") in c.detail
    assert c.fix.startswith("0002:01:00.0: the link trained below") and "lspci -vv" in c.fix


def test_a_nic_on_a_slower_pcie_link_warns(tmp_path):
    c = run(tmp_path, "pcie_speed_degraded")["link_pcie"]
    assert c.status == doctor.WARN and "PCIe 16.0 GT/s x4, the function supports 32.0 GT/s x4" in c.detail


def test_full_pcie_links_pass(tmp_path):
    c = run(tmp_path, "healthy")["link_pcie"]
    assert c.status == doctor.OK and c.detail.count("PCIe 32.0 GT/s x4 (about 126 Gb/s)") == 3


# --- link_flaps ---------------------------------------------------------------------------------------
def test_a_link_that_flapped_since_boot_warns(tmp_path):
    c = run(tmp_path, "flapped")["link_flaps"]
    assert c.status == doctor.WARN
    assert "enp1s0f0np0: carrier changed 6 times since boot (a clean start is at most 2)" in c.detail
    assert "enP2p1s0f0np0: steady (carrier changes 2)" in c.detail
    assert all(step in c.fix for step in SEED_DIAGNOSIS)


def test_a_nic_reinitialisation_is_found_in_the_kernel_log(tmp_path):
    """A hot-plugged NIC's netdev is new (carrier changes 2 again): only the kernel log tells."""
    c = run(tmp_path, "reinitialised", kernel_log="boot-then-reinit.kmsg")["link_flaps"]
    assert c.status == doctor.WARN
    assert ("enp1s0f0np0: 'Link up' 2 times in the kernel log, its NIC 0000:01:00.0 was initialised 2 times "
            "(reinitialised since boot)") in c.detail
    pcie = run(tmp_path / "b", "reinitialised", kernel_log="boot-then-reinit.kmsg")["link_pcie"]
    assert pcie.status == doctor.WARN and "the kernel logged its PCIe bandwidth limited 1 time(s)" in pcie.detail


def test_a_clean_boot_passes(tmp_path):
    c = run(tmp_path, "healthy")["link_flaps"]
    assert c.status == doctor.OK and "enp1s0f0np0: steady (carrier changes 2)" in c.detail
    assert "kernel-log records read" in c.detail


def test_an_unreadable_kernel_log_still_checks_the_carrier(tmp_path):
    c = run(tmp_path, "flapped", kernel_log=None)["link_flaps"]
    assert c.status == doctor.WARN and "carrier changed 6 times" in c.detail and "not readable" in c.detail
    c = run(tmp_path / "b", "healthy", kernel_log=None)["link_flaps"]
    assert c.status == doctor.INFO


def test_run_checks_ends_with_the_link_checks_and_reads_the_links_setting(tmp_path):
    cpu_box = dict(vllm_version=lambda: "not installed", in_window=lambda: False, capabilities=dict,
                   has_cuda=lambda: False, device_name=lambda: "cpu", capability=lambda: None,
                   backend_imports=dict, plugin_entry_points=list)   # nothing of vLLM is imported
    probe = doctor.Probe(**cpu_box, extra={"sysfs_root": str(tree(tmp_path, "healthy")), "vllm_env_names": set,
                                           "port_rate": lambda _i: SPARK_PORT,
                                           "kernel_log_path": str(FIXTURES / "doctor" / "clean-boot.kmsg")})
    checks = doctor.run_checks({}, doctor.parse_serve_args(TP2), probe)
    assert [c.name for c in checks[-5:]] == ["link_named", "link_rdma", "link_rate", "link_pcie", "link_flaps"]
    off = doctor.run_checks({"SPARK_PLUGIN_LINKS": "off"}, doctor.parse_serve_args(["serve", "m"]), probe)
    assert off[-1].name == "links" and off[-1].status == doctor.NA


# --- the probe's parts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, default, expected", [
    ("10.0.0.2", None, ("10.0.0.2", wire.DEFAULT_PORT)), ("10.0.0.2:9000", None, ("10.0.0.2", 9000)),
    ("[fe80::1%eth0]:9000", None, ("fe80::1%eth0", 9000)), ("::1", None, ("::1", wire.DEFAULT_PORT)),
    ("spark-2", None, ("spark-2", wire.DEFAULT_PORT)), ("9000", "", ("", 9000)), (":9000", "", ("", 9000)),
])
def test_endpoints(text, default, expected):
    assert wire.parse_endpoint(text, default) == expected


@pytest.mark.parametrize("text", ["9000", ":9000", "host:port", "host:70000"])
def test_a_probe_endpoint_needs_a_host_and_a_port_number(text):
    with pytest.raises(ValueError):
        wire.parse_endpoint(text)


def test_limits_are_bounded():
    assert units.parse_size("1G") == 1 << 30 and units.parse_size("512MiB") == 512 << 20
    assert units.parse_size("100") == 100 and units.parse_size("0") == 0   # each caller sets its own range
    with pytest.raises(ValueError, match=r"not a size: 'lots' \(use e.g. 1G, 512M\)"):
        units.parse_size("lots")
    for bad in (dict(seconds=61), dict(seconds=0), dict(bytes=(16 << 30) + 1), dict(streams=17), dict(streams=0)):
        with pytest.raises(ValueError):
            wire.Limits(**bad)
    assert wire.Limits(3, 1 << 20, 8).within(wire.Limits(10, 1 << 30, 4)) == wire.Limits(3, 1 << 20, 4)


def test_the_route_is_the_longest_matching_prefix(tmp_path):
    (tmp_path / "route").write_text(   # /proc/net/route: host-order hex (net/ipv4/fib_trie.c fib_route_seq_show)
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t010011AC\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        "enp1s0f0np0\t0000FEA9\t00000000\t0001\t0\t0\t100\t0000FFFF\t0\t0\t0\n"
        "enp1s0f1np1\t0000FEA9\t00000000\t0001\t0\t0\t101\t0000FFFF\t0\t0\t0\n")
    assert lp.route_interface("169.254.3.7", proc_net=str(tmp_path)) == ("enp1s0f0np0", f"{tmp_path}/route")
    assert lp.route_interface("8.8.8.8", proc_net=str(tmp_path))[0] == "eth0"
    assert lp.route_interface("127.0.0.1", proc_net=str(tmp_path))[0] == "lo"
    assert lp.route_interface("10.0.0.5", "10.0.0.5", proc_net=str(tmp_path))[0] == "lo"   # this host's own address
    assert lp.route_interface("not-an-ip")[0] is None


def test_the_negotiated_rate_comes_from_the_link_sources():
    sysfs = str(SPARK_SYS)
    assert lp.negotiated_rate("enp1s0f0np0", sysfs) == (200e9 / 8, "")
    rate, why = lp.negotiated_rate("enp1s0f1np1", sysfs)
    assert rate is None and "no link speed" in why
    assert lp.negotiated_rate("lo")[0] is None and lp.negotiated_rate("enp9s9", sysfs)[1].startswith("enp9s9 is not in")


@pytest.fixture
def server():
    """A link server on loopback with its own limits: 2 s, 32 MiB, 16 streams; serves until the test ends."""
    srv = LinkServer("127.0.0.1", 0, wire.Limits(seconds=2, bytes=32 << 20, streams=16))
    stop, lines = threading.Event(), []
    thread = threading.Thread(target=srv.serve, kwargs=dict(count=0, stop=stop, log=lines.append), daemon=True)
    thread.start()
    yield srv, lines
    stop.set()
    thread.join(5)
    srv.close()


def test_a_loopback_probe_is_bounded_by_the_stricter_limits(server):
    srv, lines = server
    t0 = time.monotonic()
    r = lp.probe("127.0.0.1", srv.address[1], wire.Limits(seconds=5, bytes=1 << 30, streams=4))
    assert time.monotonic() - t0 < 2 + wire.SETUP_TIMEOUT + wire.REPORT_TIMEOUT
    assert (r.seconds_limit, r.bytes_limit, r.streams) == (2, 32 << 20, 4)   # the server's bytes and seconds win
    assert r.bytes == r.sent_bytes == 32 << 20 and r.ended == "byte limit" and 0 < r.seconds <= 2
    assert r.interface == "lo" and r.negotiated_bytes_per_second is None and r.share is None
    check = lp.result_check(r)
    assert check.status == doctor.INFO and "over lo" in check.detail and "host's own ceiling" in check.detail
    deadline = time.monotonic() + 2
    while not lines and time.monotonic() < deadline:   # the server logs after it sent the report
        time.sleep(0.01)
    assert lines and lines[-1].startswith("probe from 127.0.0.1: 4 stream(s), 33554432 bytes")


def test_a_probe_never_sends_more_than_its_byte_limit(server):
    srv, _ = server
    r = lp.probe("127.0.0.1", srv.address[1], wire.Limits(seconds=2, bytes=3 * wire.CHUNK + 17, streams=3))
    assert r.bytes == r.sent_bytes == 3 * wire.CHUNK + 17 and r.ended == "byte limit"


def test_a_busy_server_declines_a_second_probe(server):
    srv, lines = server
    with socket.create_connection(srv.address, timeout=2) as hold:   # occupies the server: a hello, no streams
        hello = {"probe": wire.PROTOCOL, "streams": 1, "seconds": 1, "bytes": 1 << 20}
        hold.sendall(json.dumps(hello).encode() + b"\n")
        assert json.loads(hold.recv(4096))["ok"] is True
        with pytest.raises(wire.ProbeError, match=r"declined the probe: busy: another probe is running"):
            lp.probe("127.0.0.1", srv.address[1], wire.Limits(seconds=1, bytes=1 << 20, streams=1))
    time.sleep(3 * wire.POLL_SECONDS)   # the server sees the held session close within one accept poll
    assert lp.probe("127.0.0.1", srv.address[1], wire.Limits(seconds=1, bytes=1 << 20, streams=1)).bytes == 1 << 20
    assert any(line.endswith("it closed before its data streams arrived") for line in lines)


def test_a_refused_probe_is_one_line_and_quick():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # bound, not listening: connections are refused
        t0 = time.monotonic()
        with pytest.raises(wire.ProbeError, match=r"^127.0.0.1:\d+ refused the connection: start `vllm-spark doctor "
                                                 r"--link-serve PORT` there"):
            lp.probe("127.0.0.1", port, wire.Limits(seconds=1))
        assert time.monotonic() - t0 < 1


def test_a_peer_that_never_answers_times_out(monkeypatch):
    monkeypatch.setattr(lp, "SETUP_TIMEOUT", 0.5)   # the probe's own bound (its name in link_probe); no server here
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()   # accepts (the kernel does) and never says a word
        t0 = time.monotonic()
        with pytest.raises(wire.ProbeError, match=r"accepted the connection but did not answer within 0.5 s"):
            lp.probe("127.0.0.1", s.getsockname()[1], wire.Limits(seconds=1))
        assert time.monotonic() - t0 < 2


def test_the_verdict_against_a_negotiated_rate():
    base = dict(peer="spark-2", address="169.254.3.7", port=7471, interface="enp1s0f0np0", route="/proc/net/route",
                streams=4, seconds_limit=10, bytes_limit=1 << 30, bytes=1 << 30, seconds=5.0, sent_bytes=1 << 30,
                wall_seconds=5.3, ended="byte limit", negotiated_unknown="")
    slow = lp.ProbeResult(**base, achieved_bytes_per_second=1.6e9 / 8 * 10, negotiated_bytes_per_second=25e9)
    c = lp.result_check(slow)   # 16 Gb/s of 200: the seed's ring link
    assert c.status == doctor.WARN and "16.00 Gb/s, 8% of enp1s0f0np0's negotiated 200.00 Gb/s: under 25%" in c.detail
    assert "--link-probe 127.0.0.1" in c.fix and all(step in c.fix for step in SEED_DIAGNOSIS)
    fast = lp.ProbeResult(**base, achieved_bytes_per_second=100e9 / 8, negotiated_bytes_per_second=25e9)
    assert lp.result_check(fast).status == doctor.OK


