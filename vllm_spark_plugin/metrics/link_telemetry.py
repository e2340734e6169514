"""Link telemetry on the background thread: the interfaces a multi-node deployment runs over.

Sampled once per hardware interval by the hardware leader (`metrics.telemetry.Hardware`), beside the
memory sources and never on the per-step path.  Which interfaces: the `links` setting
(SPARK_PLUGIN_LINKS: auto, off or names; `link_sources.select_interfaces`), re-read every pass so
a NIC that appears later is followed too, and one followed before stays followed (and reads as down
while it is gone); at most `link_sources.MAX_INTERFACES` label values for the process's life.

Counters are exporter-side deltas, as the PSI stall counter: the first reading is the baseline (the
series exists at 0), a reading that goes backwards, a recreated netdev (new ifindex) or a change of
counter source (RDMA port counters <-> netdev statistics) adds 0 and starts a new baseline.

Sources set `vllm_spark_link_source_available{source}`: `sysfs` (a followed interface was read),
`rdma` (one of them is carried by an RDMA port whose counters were read), `kernel_log` (the link
messages of the kernel log the memory telemetry reads are counted).  A source that cannot be read
logs one line the first time and then only keeps its gauge at 0; malformed sysfs values are counted
in `vllm_spark_plugin_errors_total{where="invalid_link_sysfs"}`, failures of this code under
`where="links_sysfs"` / `"links_kernel_log"`.  Nothing here raises into the caller.
"""
from __future__ import annotations

import logging
import os

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.common import link_sources as ls

log = logging.getLogger("vllm_spark_plugin")

SYSFS, RDMA_SOURCE, KERNEL_LOG = "sysfs", "rdma", "kernel_log"
KINDS = ("current", "max")


class LinkTelemetry:
    """One per process (the hardware leader).  `ins` is the Instruments object; `links` the setting."""

    def __init__(self, ins, links: str = "auto", sysfs_root: str = "/sys", environ=None,
                 port_rates: ls.PortRates | None = None) -> None:
        self.ins = ins
        self.links = (links or "off").strip()
        self.off = self.links.lower() == "off"
        self.sysfs_root = sysfs_root
        self.environ = os.environ if environ is None else environ
        self.port_rates = ls.PortRates() if port_rates is None else port_rates
        self._followed: dict[str, ls.Selected] = {}       # every interface given series, in order
        self._addresses: dict[str, str] = {}              # interface -> its NIC's PCI address, last known
        self._last: dict[tuple[str, str], tuple] = {}     # (interface, counter) -> (identity, reading)
        self._info: dict[str, tuple] = {}                 # interface -> its link_info label values
        self._said: set[str] = set()                      # what was logged once
        self._events_ready = False

    # -- helpers -----------------------------------------------------------------------------------
    def _once(self, key: str, level: int, msg: str, *args) -> None:
        if key not in self._said:
            self._said.add(key)
            log.log(level, "vllm-spark-plugin: " + msg, *args)

    def _available(self, source: str, ok: bool, why: str = "", level: int = logging.INFO) -> None:
        self.ins.link_source_available.labels(source).set(1 if ok else 0)
        if ok:
            self._said.discard("source " + source)
        elif why:
            self._once("source " + source, level, "link source %s unavailable (%s); vllm_spark_link_source_available"
                       "{source=\"%s\"} = 0, not retried in the log", source, why, source)

    @staticmethod
    def _set(gauge, labels: tuple, value) -> None:
        """Set the child, or remove it while the value is unknown (absent, not a stale number)."""
        if value is None:
            try:
                gauge.remove(*labels)
            except KeyError:
                pass
        else:
            gauge.labels(*labels).set(value)

    def _count(self, counter, interface: str, name: str, identity: tuple, reading: int | None) -> None:
        if reading is None:
            return  # keep the baseline: a read that failed once loses nothing
        before = self._last.get((interface, name))
        self._last[(interface, name)] = (identity, reading)
        child = counter.labels(interface)
        if before is None or before[0] != identity or reading < before[1]:
            child.inc(0)   # first reading, recreated device, other source, or reset: a new baseline
        else:
            child.inc(reading - before[1])

    # -- one pass ----------------------------------------------------------------------------------
    def sample(self, kernel_log=None) -> None:
        """Every followed interface, then this pass's kernel-log records (`memory_sources.KernelLog`
        from the memory telemetry; None when the log was not read).  Never raises."""
        try:
            self.sample_links()
        except Exception as exc:
            errors.report("links_sysfs", exc)
        try:
            self.sample_events(kernel_log)
        except Exception as exc:
            errors.report("links_kernel_log", exc)

    def _select(self) -> list[ls.Selected]:
        """This pass's selection added to every interface followed before: one that disappears (a NIC
        reinitialising drops its netdev and RDMA device) stays followed and reads as down."""
        for sel in ls.select_interfaces(self.links, self.environ, self.sysfs_root):
            if sel.interface not in self._followed:
                if len(self._followed) >= ls.MAX_INTERFACES:
                    self._once("cap " + sel.interface, logging.WARNING, "link %s (%s) not followed: %d interfaces "
                               "already have series, the most one process exports", sel.interface, sel.why,
                               ls.MAX_INTERFACES)
                    continue
                log.info("vllm-spark-plugin: following link %s (%s)", sel.interface, sel.why)
            self._followed[sel.interface] = sel
        return list(self._followed.values())

    def sample_links(self) -> None:
        if self.off:
            self._available(SYSFS, False, "turned off by SPARK_PLUGIN_LINKS")
            self._available(RDMA_SOURCE, False)
            return
        selected = self._select()
        if not selected:
            why = ("SPARK_PLUGIN_LINKS=auto found no RDMA device and no NCCL_SOCKET_IFNAME, NCCL_IB_HCA or "
                   "GLOO_SOCKET_IFNAME interface: a single box; set SPARK_PLUGIN_LINKS=IFACE to follow one")
            self._available(SYSFS, False, why)
            self._available(RDMA_SOURCE, False)
            return
        read = rdma = 0
        for sel in selected:
            link = ls.read_link(sel.interface, self.sysfs_root, sel.rdma, self.port_rates)
            if link.invalid:
                self.ins.errors.labels(where="invalid_link_sysfs").inc(link.invalid)
            self._publish(sel, link)
            read += link.exists
            rdma += link.counter_source == ls.RDMA
        names = ", ".join(s.interface for s in selected)
        self._available(SYSFS, read > 0, f"none of {names} exists under {self.sysfs_root}/class/net",
                        level=logging.WARNING)
        self._available(RDMA_SOURCE, rdma > 0, f"no RDMA port counters carry {names}")

    def _publish(self, sel: ls.Selected, link: ls.Link) -> None:
        ins, name = self.ins, link.interface
        ins.link_up.labels(name).set(1 if link.operstate == "up" else 0)
        if not link.exists:
            self._once("absent " + name, logging.WARNING, "link %s (%s) does not exist; vllm_spark_link_up"
                       "{interface=\"%s\"} = 0", name, sel.why, name)
            for gauge in (ins.link_rate, ins.link_port_rate):
                self._set(gauge, (name,), None)
            self._publish_pcie(name, None)
            self._set_info(name, None)
            return
        self._said.discard("absent " + name)
        self._set(ins.link_rate, (name,), link.rate_bytes_per_second)
        self._set(ins.link_port_rate, (name,), link.port_rate_bytes_per_second)
        self._publish_pcie(name, link.pcie)
        if link.pcie is not None:
            self._addresses[name] = link.pcie.address
        identity = (link.ifindex, link.counter_source)
        self._count(ins.link_transmit, name, "tx", identity, link.tx_bytes)
        self._count(ins.link_receive, name, "rx", identity, link.rx_bytes)
        self._count(ins.link_carrier_changes, name, "carrier", (link.ifindex,), link.carrier_changes)
        self._set_info(name, (name, link.counter_source or "none", link.rdma_device or "none", link.driver or "none"))

    def _publish_pcie(self, name: str, pcie: ls.PcieLink | None) -> None:
        speeds = (pcie.speed_gts, pcie.max_speed_gts) if pcie else (None, None)
        widths = (pcie.width, pcie.max_width) if pcie else (None, None)
        for kind, speed, width in zip(KINDS, speeds, widths):
            self._set(self.ins.link_pcie_speed, (name, kind), speed)
            self._set(self.ins.link_pcie_width, (name, kind), width)

    def _set_info(self, name: str, labels: tuple | None) -> None:
        old = self._info.get(name)
        if old == labels:
            return
        if old is not None:
            self._set(self.ins.link_info, old, None)   # one info series per interface
        if labels is None:
            self._info.pop(name, None)
        else:
            self._info[name] = labels
            self.ins.link_info.labels(*labels).set(1)

    # -- kernel-log events -------------------------------------------------------------------------
    def _ours(self, event: ls.LinkEvent) -> bool:
        """A message about a followed interface or its NIC (by PCI address: a reinitialising NIC
        logs before, or without, its netdev)."""
        return event.interface in self._followed or event.device in self._addresses.values()

    def sample_events(self, kernel_log) -> None:
        if self.off or kernel_log is None:
            # the memory telemetry logged why the kernel log is not read; off: nothing to say
            self._available(KERNEL_LOG, False)
            return
        if not self._events_ready:
            self._events_ready = True
            for kind in ls.LINK_EVENT_KINDS:  # series exist at 0, so increase() sees the first event
                self.ins.link_events.labels(kind).inc(0)
        self._available(KERNEL_LOG, True)
        for event, n in kernel_log.links.items():
            if self._ours(event):
                self.ins.link_events.labels(event.kind).inc(n)
