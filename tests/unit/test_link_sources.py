"""Readers of the links a deployment runs over, on recorded formats (tests/fixtures/links, whose README
names each file's source): a DGX Spark's ConnectX-7 sysfs tree, mlx5 and netdev kernel messages,
`ethtool` output.  Every parser's malformed input, the RDMA word count x 4, the NCCL variable rules
and the bound of 16 interfaces.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from vllm_spark_plugin.common import link_sources as ls
from vllm_spark_plugin.common import memory_sources as ms
from support.link_tree import SPARK_SYS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "links"
SPARK = str(SPARK_SYS)
PORT1 = SPARK_SYS / "devices/pci0000:00/0000:00:00.0/0000:01:00.0"


def words(name: str) -> int:
    return int((PORT1 / "infiniband/mlx5_0/ports/1/counters" / name).read_text())


def spark_copy(tmp_path) -> Path:
    """A writable copy of the Spark tree (symlinks kept), to corrupt or advance."""
    root = tmp_path / "sys"
    shutil.copytree(SPARK, root, symlinks=True)
    return root


def netdevs(tmp_path, names) -> str:
    """A sysfs with plain netdevs (no RDMA), each with statistics."""
    root = tmp_path / "plain" / "sys"
    for name in names:
        d = root / "class" / "net" / name
        (d / "statistics").mkdir(parents=True)
        (d / "operstate").write_text("up\n")
        (d / "statistics" / "tx_bytes").write_text("1\n")
        (d / "statistics" / "rx_bytes").write_text("2\n")
    return str(root)


# --- one interface ----------------------------------------------------------------------------------
def test_rdma_devices_pair_each_port_with_its_netdev_under_either_naming():
    assert ls.rdma_devices(SPARK) == {"mlx5_0": [(1, "enp1s0f0np0")], "mlx5_1": [(1, "enp1s0f1np1")],
                                      "roceP2p1s0f0": [(1, "enP2p1s0f0np0")]}
    assert ls.rdma_port_for("enP2p1s0f0np0", SPARK) == ("roceP2p1s0f0", 1)
    assert ls.rdma_port_for("lo", SPARK) is None and ls.rdma_devices("/nonexistent") == {}


def test_rdma_port_netdev_from_a_later_gid_or_the_one_netdev_of_the_function(tmp_path):
    root = spark_copy(tmp_path)
    ndevs = root / "devices/pci0000:00/0000:00:00.0/0000:01:00.0/infiniband/mlx5_0/ports/1/gid_attrs/ndevs"
    (ndevs / "0").unlink()                                          # GID 0 unset: index 1 names it
    assert ls.rdma_devices(str(root))["mlx5_0"] == [(1, "enp1s0f0np0")]
    shutil.rmtree(ndevs)                                            # no GID table: one port, one netdev
    assert ls.rdma_devices(str(root))["mlx5_0"] == [(1, "enp1s0f0np0")]
    (ndevs.parents[2] / "2").mkdir()                                # two ports, no GID table: not known
    assert ls.rdma_devices(str(root))["mlx5_0"] == [(1, None), (2, None)]


def test_rdma_backed_link_counts_port_words_times_four():
    link = ls.read_link("enp1s0f0np0", SPARK, ("mlx5_0", 1))
    assert link.counter_source == ls.RDMA
    assert link.tx_bytes == 4 * words("port_xmit_data") and link.rx_bytes == 4 * words("port_rcv_data")
    assert link.tx_bytes != int((PORT1 / "net/enp1s0f0np0/statistics/tx_bytes").read_text())  # not the netdev's
    assert link.rate_bytes_per_second == 200e9 / 8 and link.operstate == "up"
    assert (link.rdma_device, link.rdma_port, link.driver, link.carrier_changes, link.ifindex) == \
        ("mlx5_0", 1, "mlx5_core", 2, 3)
    assert link.pcie == ls.PcieLink("0000:01:00.0", 32.0, 32.0, 4, 4) and link.pcie.degraded is False
    assert link.invalid == 0 and link.port_rate_bytes_per_second is None  # no PortRates: not looked up


def test_without_its_rdma_port_the_netdev_statistics_are_read():
    link = ls.read_link("enp1s0f0np0", SPARK)
    assert link.counter_source == ls.NETDEV and link.tx_bytes == 1843220 and link.rx_bytes == 2204117


def test_nic_on_half_its_pcie_lanes_is_degraded():
    link = ls.read_link("enP2p1s0f0np0", SPARK, ("roceP2p1s0f0", 1))
    assert link.pcie == ls.PcieLink("0002:01:00.0", 32.0, 32.0, 2, 4) and link.pcie.degraded is True


def test_link_that_is_down_has_no_rate():
    link = ls.read_link("enp1s0f1np1", SPARK, ("mlx5_1", 1))  # speed -1, port "1: DOWN"
    assert link.operstate == "down" and link.rate_bytes_per_second is None and link.invalid == 0


def test_virtual_and_absent_interfaces():
    lo = ls.read_link("lo", SPARK)
    assert lo.exists and lo.pcie is None and lo.driver is None and lo.counter_source == ls.NETDEV
    assert lo.rate_bytes_per_second is None and lo.operstate == "unknown"
    gone = ls.read_link("enp9s0", SPARK)
    assert not gone.exists and gone.operstate is None and gone.tx_bytes is None and gone.invalid == 0
    assert not ls.read_link("../../etc", SPARK).exists  # a name that is no interface name reads nothing


@pytest.mark.parametrize("path, content, field, expected", [
    ("net/enp1s0f0np0/operstate", "sideways", "operstate", None),
    ("net/enp1s0f0np0/speed", "fast", "rate_bytes_per_second", None),
    ("net/enp1s0f0np0/speed", "-7", "rate_bytes_per_second", None),
    ("net/enp1s0f0np0/carrier_changes", "", "carrier_changes", None),          # empty: cut short
    ("net/enp1s0f0np0/carrier_changes", "-1", "carrier_changes", None),
    ("net/enp1s0f0np0/ifindex", "0", "ifindex", None),
    ("net/enp1s0f0np0/statistics/tx_bytes", "12x", "tx_bytes", None),
    ("current_link_speed", "fast PCIe", "pcie.speed_gts", None),
    ("current_link_width", "x4", "pcie.width", None),
])
def test_malformed_netdev_and_pcie_files_are_counted_not_raised(tmp_path, path, content, field, expected):
    root = spark_copy(tmp_path)
    (root / "devices/pci0000:00/0000:00:00.0/0000:01:00.0" / path).write_text(content + "\n")
    link = ls.read_link("enp1s0f0np0", str(root))
    obj, _, attr = field.rpartition(".")
    assert getattr(getattr(link, obj) if obj else link, attr) == expected and link.invalid == 1


@pytest.mark.parametrize("counter", ["port_xmit_data", "port_rcv_data"])
def test_malformed_port_counter_falls_back_to_the_netdev_for_both(tmp_path, counter):
    root = spark_copy(tmp_path)
    (root / "devices/pci0000:00/0000:00:00.0/0000:01:00.0/infiniband/mlx5_0/ports/1/counters" / counter).write_text("-5\n")
    link = ls.read_link("enp1s0f0np0", str(root), ("mlx5_0", 1))
    assert link.counter_source == ls.NETDEV and (link.tx_bytes, link.rx_bytes) == (1843220, 2204117)
    assert link.invalid == 1


def test_malformed_port_rate_is_counted(tmp_path):
    root = spark_copy(tmp_path)
    port = root / "devices/pci0000:00/0000:00:00.0/0000:01:00.0/infiniband/mlx5_0/ports/1"
    (root / "devices/pci0000:00/0000:00:00.0/0000:01:00.0/net/enp1s0f0np0/speed").write_text("-1\n")
    (port / "rate").write_text("very fast\n")
    link = ls.read_link("enp1s0f0np0", str(root), ("mlx5_0", 1))
    assert link.rate_bytes_per_second is None and link.invalid == 1
    (port / "rate").write_text("100 Gb/sec (2X NDR)\n")
    assert ls.read_link("enp1s0f0np0", str(root), ("mlx5_0", 1)).rate_bytes_per_second == 12.5e9


def test_unreadable_files_are_unknown_not_invalid(tmp_path):
    root = spark_copy(tmp_path)
    stats = root / "devices/pci0000:00/0000:00:00.0/0000:01:00.0/net/enp1s0f0np0/statistics"
    (stats / "tx_bytes").unlink()
    (stats / "tx_bytes").mkdir()                    # open() fails: as a file that cannot be read
    link = ls.read_link("enp1s0f0np0", str(root))
    assert link.tx_bytes is None and link.counter_source is None and link.invalid == 0


@pytest.mark.parametrize("text, expected", [
    ("200 Gb/sec (4X HDR)", 25e9), ("2.5 Gb/sec (1X SDR)", 2.5e9 / 8), ("400 Gb/sec (4X NDR)\n", 50e9),
    ("", None), ("fast", None), ("Gb/sec (4X HDR)", None), ("200Gb/sec", None),
])
def test_parse_rate(text, expected):
    assert ls.parse_rate(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("32.0 GT/s PCIe", 32.0), ("8 GT/s", 8.0), ("2.5 GT/s PCIe", 2.5), ("Unknown", None), ("GT/s", None),
])
def test_parse_pcie_speed(text, expected):
    assert ls.parse_pcie_speed(text) == expected


def test_pcie_degraded_is_unknown_without_all_four_values():
    assert ls.PcieLink("0000:01:00.0", 32.0, None, 4, 4).degraded is None
    assert ls.PcieLink("0000:01:00.0", 16.0, 32.0, 4, 4).degraded is True


# --- interface selection ----------------------------------------------------------------------------
def test_auto_follows_every_rdma_netdev_then_nccl_then_gloo_never_lo():
    env = {"NCCL_SOCKET_IFNAME": "enp1s0f0", "GLOO_SOCKET_IFNAME": "lo,enp1s0f1np1,eth7"}
    got = ls.select_interfaces("auto", env, SPARK)
    assert [(s.interface, s.why) for s in got] == [
        ("enp1s0f0np0", "rdma mlx5_0 port 1"), ("enp1s0f1np1", "rdma mlx5_1 port 1"),
        ("enP2p1s0f0np0", "rdma roceP2p1s0f0 port 1"), ("eth7", "GLOO_SOCKET_IFNAME")]
    assert got[0].rdma == ("mlx5_0", 1) and got[-1].rdma is None


@pytest.mark.parametrize("hca, expected", [
    ("mlx5", ["enp1s0f0np0", "enp1s0f1np1"]),          # prefixes
    ("=mlx5_0:1", ["enp1s0f0np0"]),                    # exact, with the port
    ("mlx5_0:2", []),                                  # no port 2
    ("=mlx5", []),                                     # exact: no device is called mlx5
    ("^mlx5", ["enP2p1s0f0np0"]),                      # exclude
    ("^=roceP2p1s0f0", ["enp1s0f0np0", "enp1s0f1np1"]),
])
def test_nccl_ib_hca_rules_choose_the_rdma_netdevs(hca, expected):
    assert [s.interface for s in ls.select_interfaces("auto", {"NCCL_IB_HCA": hca}, SPARK)] == expected


@pytest.mark.parametrize("ifname, expected", [
    ("eth", ["eth0", "eth1"]),          # NCCL matches prefixes
    ("=eth0", ["eth0"]),
    ("=eth", ["eth"]),                  # exact name that does not exist: named but absent
    ("eno1,eth1", ["eno1", "eth1"]),
    ("eth9", ["eth9"]),                 # a prefix that matches nothing is the name itself, absent
    ("^docker", []),                    # an exclusion names nothing to follow
    ("^=docker0", []),
    ("lo", []),
    ("", []),
])
def test_nccl_socket_ifname_rules(tmp_path, ifname, expected):
    root = netdevs(tmp_path, ["docker0", "eno1", "eth0", "eth1", "lo"])
    assert [s.interface for s in ls.select_interfaces("auto", {"NCCL_SOCKET_IFNAME": ifname}, root)] == expected


def test_parse_nccl_list():
    lst = ls.parse_nccl_list("^=mlx5_0:1, mlx5_1,,")
    assert (lst.exclude, lst.exact, lst.items) == (True, True, (("mlx5_0", 1), ("mlx5_1", None)))
    assert not lst.admits("mlx5_0", 1) and lst.admits("mlx5_0", 2) and lst.admits("mlx5_10")
    assert ls.parse_nccl_list(None).admits("anything")


def test_selection_is_bounded_at_sixteen(tmp_path):
    root = netdevs(tmp_path, [f"eth{i}" for i in range(20)])
    got = ls.select_interfaces("auto", {"NCCL_SOCKET_IFNAME": "eth"}, root)
    assert len(got) == ls.MAX_INTERFACES == 16
    named = ",".join(f"eth{i}" for i in range(20))
    assert len(ls.select_interfaces(named, {}, root)) == 16


def test_named_interfaces_and_off():
    got = ls.select_interfaces("enp1s0f0np0,enp9s0", {"NCCL_SOCKET_IFNAME": "eth"}, SPARK)
    assert [(s.interface, s.why, s.rdma) for s in got] == [
        ("enp1s0f0np0", "SPARK_PLUGIN_LINKS", ("mlx5_0", 1)), ("enp9s0", "SPARK_PLUGIN_LINKS", None)]
    assert ls.select_interfaces("off", {"GLOO_SOCKET_IFNAME": "eth0"}, SPARK) == []
    assert ls.select_interfaces("auto", {}, "/nonexistent") == []


# --- kernel log -------------------------------------------------------------------------------------
def test_reinitialisation_records_from_dev_kmsg():
    reader = ms.KmsgReader(str(FIXTURES / "kernel_log" / "mlx5-reinit.kmsg"), from_start=True)
    reader.open()
    got = reader.read_new()
    reader.close()
    E = ls.LinkEvent
    assert got.links == {
        E(ls.LINK_DOWN, "0000:01:00.0", "enp1s0f0np0"): 1, E(ls.LINK_UP, "0000:01:00.0", "enp1s0f0np0"): 1,
        E(ls.LINK_DOWN, "0007:01:00.0", "enP7s7"): 1, E(ls.LINK_UP, "0007:01:00.0", "enP7s7"): 1,
        E(ls.NIC_REINIT, "0000:01:00.0", None): 1, E(ls.NIC_REINIT, "0000:01:00.1", None): 1,
        E(ls.PCIE_DEGRADED, "0000:01:00.0", None): 1, E(ls.PCIE_DEGRADED, "0002:01:00.0", None): 1}
    # the same read counts the NVRM record; the user-space "Link down" (facility 1) counts nowhere
    assert got.xids == {31: 1} and got.records == 11 and got.invalid == 0


def test_the_same_messages_as_dmesg_prints_them():
    got = ms.parse_kernel_text((FIXTURES / "kernel_log" / "mlx5-reinit.dmesg").read_text())
    kinds = {}
    for event, n in got.links.items():
        kinds[event.kind] = kinds.get(event.kind, 0) + n
    assert kinds == {ls.LINK_DOWN: 2, ls.LINK_UP: 2, ls.NIC_REINIT: 2, ls.PCIE_DEGRADED: 1}


@pytest.mark.parametrize("message, kind", [
    ("mlx5_core 0000:01:00.0 enp1s0f0np0: Link up", ls.LINK_UP),
    ("mlx5_core 0000:01:00.0 enp1s0f0np0 (unregistering): Link down", ls.LINK_DOWN),
    ("e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex, Flow Control: Rx/Tx", ls.LINK_UP),
    ("enp3s0: Link is Down", ls.LINK_DOWN),
    ("Sep 14 23:16:52 spark kernel: mlx5_core 0000:01:00.0: firmware version: 28.45.1200", ls.NIC_REINIT),
    ("[Mon Sep  1 10:00:00 2025] pci 0000:01:00.0: 7.876 Gb/s available PCIe bandwidth, limited by "
     "8.0 GT/s PCIe x1 link at 0000:00:00.0 (capable of 126.016 Gb/s with 8.0 GT/s PCIe x16 link)", ls.PCIE_DEGRADED),
    # not events
    ("mlx5_core 0000:01:00.1: 126.028 Gb/s available PCIe bandwidth (32.0 GT/s PCIe x4 link)", None),
    ("pcieport 0000:00:01.0: pciehp: Slot(2): Link Down", None),
    ("IPv6: ADDRCONF(NETDEV_CHANGE): enp1s0f0np0: link becomes ready", None),
    ("bnx2x 0000:03:00.0: firmware version: 7.13.1", None),      # reinitialisation is counted for mlx5
    ("mlx5_core 0000:01:00.0 enp1s0f0np0: Link", None),          # cut short
    ("mlx5_core 0000:01:00.0 enp1s0f0np0: Linked list corrupted", None),
    ("Link up", None),                                            # no device, no netdev
    ("", None),
])
def test_classify_link_message(message, kind):
    assert ls.classify_link_message(message) == kind


def test_nvrm_lines_stay_nvrm_events():
    got = ms.KernelLog()
    ms.classify("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000)", got)
    assert got.xids == {149: 1} and not got.links
    other = ms.KernelLog()
    ms.classify("mlx5_core 0000:01:00.0 enp1s0f0np0: Link down", other)
    got.add(other)
    assert sum(got.links.values()) == 1 and got.xids == {149: 1}


# --- the port's best rate (ethtool) -----------------------------------------------------------------
def test_ethtool_supported_link_modes():
    assert ls.parse_ethtool_supported((FIXTURES / "ethtool" / "swp1-lanes-commit.txt").read_text()) == 12.5e9
    veth = "Settings for veth0:\n\tSupported ports: [  ]\n\tSupported link modes:   Not reported\n\tSpeed: 10000Mb/s\n"
    assert ls.parse_ethtool_supported(veth) is None
    assert ls.parse_ethtool_supported("") is None


def test_ethtool_port_rate_runs_ethtool_with_a_timeout(monkeypatch):
    monkeypatch.setattr(ls.shutil, "which", lambda name, path=None: "/usr/sbin/ethtool")
    calls = []

    def run(argv, **kw):
        calls.append((argv, kw["timeout"]))
        return subprocess.CompletedProcess(argv, 0, (FIXTURES / "ethtool" / "swp1-lanes-commit.txt").read_text(), "")

    assert ls.ethtool_port_rate("swp1", run=run) == 12.5e9
    assert calls == [(["/usr/sbin/ethtool", "swp1"], ls.ETHTOOL_TIMEOUT_SECONDS)]

    def hangs(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    assert ls.ethtool_port_rate("swp1", run=hangs) is None
    monkeypatch.setattr(ls.shutil, "which", lambda name, path=None: None)
    assert ls.ethtool_port_rate("swp1", run=run) is None and len(calls) == 1  # no ethtool: nothing run


def test_port_rates_look_each_interface_up_once():
    asked = []

    def lookup(name):
        asked.append(name)
        if name == "bad":
            raise RuntimeError("boom")
        return 25e9

    rates = ls.PortRates(lookup)
    assert [rates.get("a"), rates.get("a"), rates.get("bad"), rates.get("bad")] == [25e9, 25e9, None, None]
    assert asked == ["a", "bad"]
    link = ls.read_link("enp1s0f0np0", SPARK, ("mlx5_0", 1), rates)
    assert link.port_rate_bytes_per_second == 25e9 and asked == ["a", "bad", "enp1s0f0np0"]
