"""The link series as /metrics shows them: LinkTelemetry writes real prometheus-client instruments in a
registry of the test's own, the registry is rendered in the exposition format and read back.  Inputs:
the recorded Spark tree (tests/fixtures/links, copied where a test advances counters), and trees of
plain netdevs for the selection rules.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_spark_plugin.common import link_sources as ls
from vllm_spark_plugin.common import memory_sources as ms
from vllm_spark_plugin.metrics import telemetry
from vllm_spark_plugin.metrics.link_telemetry import LinkTelemetry
from support.link_tree import SPARK_SYS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "links"
F0 = "devices/pci0000:00/0000:00:00.0/0000:01:00.0"
MLX5_0 = F0 + "/infiniband/mlx5_0/ports/1/counters"


def scrape(registry) -> dict:
    """{(sample name, frozenset of labels): value} from the rendered exposition text."""
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(s: dict, name: str, **labels):
    return s.get((name, frozenset(labels.items())))


def series(s: dict, prefix: str) -> list:
    return sorted(((name, dict(labels)) for name, labels in s if name.startswith(prefix)), key=repr)


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(SPARK_SYS, root, symlinks=True)
    return root


def bump(path: Path, by: int) -> None:
    path.write_text(f"{int(path.read_text()) + by}\n")


def plain(tmp_path, names) -> str:
    root = tmp_path / "plain" / "sys"
    for name in names:
        d = root / "class" / "net" / name
        (d / "statistics").mkdir(parents=True)
        for f, v in (("operstate", "up"), ("statistics/tx_bytes", "10"), ("statistics/rx_bytes", "20")):
            (d / f).write_text(v + "\n")
    return str(root)


def links(fresh, root, setting="auto", environ=None, **kw) -> LinkTelemetry:
    ins = fresh.exporter("links-test").ins
    return LinkTelemetry(ins, setting, sysfs_root=str(root), environ=environ or {},
                         port_rates=kw.pop("port_rates", ls.PortRates(lambda name: None)), **kw)


# --- the Spark tree ---------------------------------------------------------------------------------
def test_spark_links_on_metrics(fresh, tree):
    t = links(fresh, tree)
    t.sample(None)
    s = scrape(fresh.registry)
    assert value(s, "vllm_spark_link_rate_bytes_per_second", interface="enp1s0f0np0") == 25e9
    assert value(s, "vllm_spark_link_rate_bytes_per_second", interface="enp1s0f1np1") is None  # down: absent
    assert [value(s, "vllm_spark_link_up", interface=i) for i in ("enp1s0f0np0", "enp1s0f1np1")] == [1, 0]
    assert value(s, "vllm_spark_link_transmit_bytes_total", interface="enp1s0f0np0") == 0   # the baseline
    assert value(s, "vllm_spark_link_pcie_width_lanes", interface="enP2p1s0f0np0", kind="current") == 2
    assert value(s, "vllm_spark_link_pcie_width_lanes", interface="enP2p1s0f0np0", kind="max") == 4
    assert value(s, "vllm_spark_link_pcie_speed_gts", interface="enp1s0f0np0", kind="current") == 32.0
    assert value(s, "vllm_spark_link_info", interface="enP2p1s0f0np0", counter_source="rdma",
                 rdma_device="roceP2p1s0f0", driver="mlx5_core") == 1
    assert [value(s, "vllm_spark_link_source_available", source=x) for x in ("sysfs", "rdma", "kernel_log")] == [1, 1, 0]
    assert value(s, "vllm_spark_link_port_rate_bytes_per_second", interface="enp1s0f0np0") is None
    assert fresh.errors_total() == 0
    assert {labels["interface"] for _, labels in series(s, "vllm_spark_link_up")} == \
        {"enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0"}


def test_rdma_counters_are_words_times_four_as_exporter_side_deltas(fresh, tree):
    t = links(fresh, tree)
    t.sample(None)
    bump(tree / MLX5_0 / "port_xmit_data", 1000)
    bump(tree / MLX5_0 / "port_rcv_data", 250)
    bump(tree / F0 / "net/enp1s0f0np0/statistics/tx_bytes", 10**9)   # RDMA backs it: netdev stats not read
    bump(tree / F0 / "net/enp1s0f0np0/carrier_changes", 2)
    t.sample(None)
    s = scrape(fresh.registry)
    assert value(s, "vllm_spark_link_transmit_bytes_total", interface="enp1s0f0np0") == 4000
    assert value(s, "vllm_spark_link_receive_bytes_total", interface="enp1s0f0np0") == 1000
    assert value(s, "vllm_spark_link_carrier_changes_total", interface="enp1s0f0np0") == 2


def reload_driver(tree: Path) -> None:
    (tree / MLX5_0 / "port_xmit_data").write_text("100\n")        # the port counters restart


def recreate_netdev(tree: Path) -> None:
    (tree / F0 / "net/enp1s0f0np0/ifindex").write_text("9\n")     # a new netdev under the old name
    bump(tree / MLX5_0 / "port_xmit_data", 1000)                    # counted against no baseline


@pytest.mark.parametrize("event", [reload_driver, recreate_netdev])
def test_a_reset_adds_nothing_and_starts_a_new_baseline(fresh, tree, event):
    t = links(fresh, tree)
    t.sample(None)
    event(tree)
    t.sample(None)
    bump(tree / MLX5_0 / "port_xmit_data", 50)
    t.sample(None)
    assert value(scrape(fresh.registry), "vllm_spark_link_transmit_bytes_total", interface="enp1s0f0np0") == 200


def test_kernel_log_events_for_the_followed_nics_only(fresh, tree):
    t = links(fresh, tree)
    t.sample(ms.KernelLog())         # the log is readable: every kind exists at 0
    s = scrape(fresh.registry)
    assert {k: value(s, "vllm_spark_link_events_total", kind=k) for k in ls.LINK_EVENT_KINDS} == \
        dict.fromkeys(ls.LINK_EVENT_KINDS, 0)
    reader = ms.KmsgReader(str(FIXTURES / "kernel_log" / "mlx5-reinit.kmsg"), from_start=True)
    reader.open()
    t.sample(reader.read_new())
    reader.close()
    s = scrape(fresh.registry)
    # enP7s7 (the 10 GbE port) is not followed; 0000:01:00.1 is enp1s0f1np1's NIC, 0002:01:00.0 enP2p1s0f0np0's
    assert {k: value(s, "vllm_spark_link_events_total", kind=k) for k in ls.LINK_EVENT_KINDS} == \
        {ls.NIC_REINIT: 2, ls.LINK_DOWN: 1, ls.LINK_UP: 1, ls.PCIE_DEGRADED: 2}
    assert value(s, "vllm_spark_link_source_available", source="kernel_log") == 1


def test_interface_that_disappears_stays_followed_and_reads_down(fresh, tree):
    t = links(fresh, tree)
    t.sample(None)
    shutil.rmtree(tree / F0 / "net")                # hot-plug: the netdev and its RDMA pairing are gone
    (tree / "class/net/enp1s0f0np0").unlink()
    t.sample(None)
    s = scrape(fresh.registry)
    assert value(s, "vllm_spark_link_up", interface="enp1s0f0np0") == 0
    assert value(s, "vllm_spark_link_rate_bytes_per_second", interface="enp1s0f0np0") is None
    assert not [labels for _, labels in series(s, "vllm_spark_link_info") if labels["interface"] == "enp1s0f0np0"]
    assert value(s, "vllm_spark_link_transmit_bytes_total", interface="enp1s0f0np0") == 0  # counters stay


def test_port_rate_from_the_lookup_once(fresh, tree):
    asked = []
    t = links(fresh, tree, "enp1s0f0np0", port_rates=ls.PortRates(lambda n: asked.append(n) or 25e9))
    t.sample(None)
    t.sample(None)
    assert value(scrape(fresh.registry), "vllm_spark_link_port_rate_bytes_per_second", interface="enp1s0f0np0") == 25e9
    assert asked == ["enp1s0f0np0"]


# --- nothing to follow, off, absent, bounded, broken --------------------------------------------------
def test_single_box_auto_selects_nothing_and_says_so_without_errors(fresh, tmp_path, caplog):
    t = links(fresh, plain(tmp_path, ["eth0", "lo"]))
    with caplog.at_level(logging.INFO, logger="vllm_spark_plugin"):
        for _ in range(3):
            t.sample(ms.KernelLog())
    s = scrape(fresh.registry)
    assert [value(s, "vllm_spark_link_source_available", source=x) for x in ("sysfs", "rdma", "kernel_log")] == [0, 0, 1]
    assert not [n for n, labels in series(s, "vllm_spark_link_") if "interface" in labels]
    said = [r.getMessage() for r in caplog.records if "link source sysfs unavailable" in r.getMessage()]
    assert len(said) == 1 and "SPARK_PLUGIN_LINKS=IFACE" in said[0]
    assert fresh.errors_total() == 0


def test_off_follows_nothing_and_counts_no_event(fresh, tree):
    t = links(fresh, tree, "off")
    reader = ms.KmsgReader(str(FIXTURES / "kernel_log" / "mlx5-reinit.kmsg"), from_start=True)
    reader.open()
    t.sample(reader.read_new())
    s = scrape(fresh.registry)
    assert series(s, "vllm_spark_link_events") == [] and series(s, "vllm_spark_link_up") == []
    assert [value(s, "vllm_spark_link_source_available", source=x) for x in ("sysfs", "rdma", "kernel_log")] == [0, 0, 0]


def test_named_interface_that_does_not_exist(fresh, tree, caplog):
    t = links(fresh, tree, "enp9s0")
    with caplog.at_level(logging.WARNING, logger="vllm_spark_plugin"):
        t.sample(None)
        t.sample(None)
    s = scrape(fresh.registry)
    assert value(s, "vllm_spark_link_up", interface="enp9s0") == 0
    assert value(s, "vllm_spark_link_source_available", source="sysfs") == 0
    assert len([r for r in caplog.records if "enp9s0 (SPARK_PLUGIN_LINKS) does not exist" in r.getMessage()]) == 1


def test_at_most_sixteen_interfaces_for_the_process_life(fresh, tmp_path):
    root = plain(tmp_path, [f"eth{i}" for i in range(20)])
    env = {"NCCL_SOCKET_IFNAME": "=" + ",".join(f"eth{i}" for i in range(16))}
    t = links(fresh, root, environ=env)
    t.sample(None)
    env["NCCL_SOCKET_IFNAME"] = "=eth16,eth17"      # others later: not followed, the first 16 stay
    t.sample(None)
    followed = {labels["interface"] for _, labels in series(scrape(fresh.registry), "vllm_spark_link_up")}
    assert followed == {f"eth{i}" for i in range(16)}


def test_malformed_sysfs_is_counted_and_broken_code_contained(fresh, tree, monkeypatch):
    (tree / F0 / "net/enp1s0f0np0/operstate").write_text("sideways\n")
    t = links(fresh, tree)
    t.sample(None)
    assert fresh.sample("vllm_spark_plugin_errors_total", where="invalid_link_sysfs") == 1
    monkeypatch.setattr(ls, "read_link", lambda *a, **k: 1 / 0)
    t.sample(ms.KernelLog())                        # never raises: counted, and the events still run
    assert fresh.sample("vllm_spark_plugin_errors_total", where="links_sysfs") == 1
    assert value(scrape(fresh.registry), "vllm_spark_link_source_available", source="kernel_log") == 1


# --- the hardware leader's loop ---------------------------------------------------------------------
class NoNvml:
    class NVMLError_LibraryNotFound(Exception):
        pass

    def nvmlInit(self):
        raise self.NVMLError_LibraryNotFound()


def test_hardware_pass_counts_link_messages_from_the_one_kernel_log_read(fresh, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,10,-;mlx5_core 0000:01:00.0 enp1s0f0np0: Link down\n")   # before start-up: history
    ins = fresh.exporter("links-test").ins
    hw = telemetry.Hardware(ins, str(kmsg), "enp1s0f0np0")   # the real /sys: no such interface here
    hw.sample(NoNvml())
    with open(kmsg, "a") as fh:
        fh.write("6,2,20,-;mlx5_core 0000:01:00.0 enp1s0f0np0: Link down\n"
                 "4,3,30,-;NVRM: Xid (PCI:000f:01:00): 31, pid=1, name=python3, Ch 00000008\n")
    hw.sample(NoNvml())
    s = scrape(fresh.registry)
    assert value(s, "vllm_spark_link_events_total", kind="link_down") == 1
    assert value(s, "vllm_spark_nvrm_xid_events_total", xid="31") == 1
    assert value(s, "vllm_spark_link_up", interface="enp1s0f0np0") == 0
