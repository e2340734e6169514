"""Readers for the network links a multi-node deployment runs over (imports nothing from vLLM).

A tensor- or pipeline-parallel ring across Sparks is as fast as its slowest link, and a NIC that came
back from a hot-plug reinitialisation can sit at a tenth of its rate with every host signal healthy
(docs/links.md).  What the kernel says about a link:

* `/sys/class/net/IF/`: `operstate`, `speed` (Mb/s; reading it fails with EINVAL while the link is
  down), `carrier_changes`, `ifindex`, `statistics/{tx,rx}_bytes`, and `device`, the NIC's PCI
  function with its `current_link_speed` / `max_link_speed` / `current_link_width` / `max_link_width`
  and its `driver`;
* `/sys/class/infiniband/DEV/ports/N/`: `rate` ("200 Gb/sec (4X HDR)"), `state`, and `counters/
  port_xmit_data` / `port_rcv_data`, which count 4-byte words, not bytes
  (Documentation/ABI/stable/sysfs-class-infiniband; mlx5 shifts its octet counters right by 2 in
  drivers/infiniband/hw/mlx5/mad.c).  RDMA traffic bypasses the netdev statistics, so where an RDMA
  port backs the interface its counters are the ones read;
* the kernel log: mlx5 (re)initialisation, link up/down and PCIe bandwidth-limited messages
  (`parse_link_message`, counted from the same records as the NVRM events in `memory_sources`);
* `ethtool IFACE`, where installed: the best rate the port supports (`PortRates`).

Which interfaces: `select_interfaces` (the `links` setting, the NCCL and Gloo variables).  Every
reader returns what it could read; a missing file is None, a malformed one is None and counted in
`invalid`.  Nothing here raises on what the system returns.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping

MAX_INTERFACES = 16   # label values per series: the links of one box, never peers or flows
INTERFACE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")  # IFNAMSIZ is 16 with the NUL
RDMA, NETDEV = "rdma", "netdev"   # counter_source
RDMA_WORD_BYTES = 4
NIC_REINIT, LINK_DOWN, LINK_UP, PCIE_DEGRADED = "nic_reinit", "link_down", "link_up", "pcie_degraded"
LINK_EVENT_KINDS = (NIC_REINIT, LINK_DOWN, LINK_UP, PCIE_DEGRADED)
NCCL_SOCKET_IFNAME, NCCL_IB_HCA, GLOO_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "GLOO_SOCKET_IFNAME"
LINKS_SETTING = "SPARK_PLUGIN_LINKS"
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
ETHTOOL_TIMEOUT_SECONDS = 2.0

_PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec\b")
_GTS = re.compile(r"^(\d+(?:\.\d+)?) GT/s\b")
_MODE = re.compile(r"\b(\d+)base")


# --- what one interface looks like ------------------------------------------------------------------
@dataclass
class PcieLink:
    """The NIC's PCI function: its link's current and maximum speed (GT/s per lane) and width."""

    address: str
    speed_gts: float | None = None
    max_speed_gts: float | None = None
    width: int | None = None
    max_width: int | None = None

    @property
    def degraded(self) -> bool | None:
        """True when the link trained below what both ends support; None when not known."""
        if None in (self.speed_gts, self.max_speed_gts, self.width, self.max_width):
            return None
        return self.speed_gts < self.max_speed_gts or self.width < self.max_width


@dataclass
class Link:
    interface: str
    exists: bool
    operstate: str | None = None
    rate_bytes_per_second: float | None = None       # negotiated: netdev speed, else the RDMA port rate
    port_rate_bytes_per_second: float | None = None  # the port's best supported rate (ethtool), if known
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    counter_source: str | None = None   # RDMA (port counters x 4) or NETDEV (statistics)
    carrier_changes: int | None = None  # since boot
    rdma_device: str | None = None
    rdma_port: int | None = None
    driver: str | None = None
    pcie: PcieLink | None = None
    ifindex: int | None = None  # changes when the netdev is recreated (driver reload, hot-plug)
    invalid: int = 0


@dataclass(frozen=True)
class Selected:
    """An interface to follow and why; `rdma` the (device, port) that backs it, if any.  A name the
    setting or an NCCL variable gives is returned even when no such interface exists."""

    interface: str
    why: str
    rdma: tuple[str, int] | None = None


# --- value parsers ----------------------------------------------------------------------------------
def parse_rate(text: str) -> float | None:
    """An RDMA port's `rate` ("200 Gb/sec (4X HDR)", "2.5 Gb/sec (1X SDR)") -> bytes/s."""
    m = _RATE.match(text.strip())
    return float(m.group(1)) * 1e9 / 8 if m else None


def parse_pcie_speed(text: str) -> float | None:
    """`current_link_speed` ("32.0 GT/s PCIe"; "8 GT/s" before Linux 5.7) -> GT/s."""
    m = _GTS.match(text.strip())
    return float(m.group(1)) if m else None


def parse_ethtool_supported(text: str) -> float | None:
    """`ethtool IFACE` output -> the fastest of its "Supported link modes" (e.g. 200000baseCR4/Full),
    bytes/s; None when it lists none ("Not reported")."""
    best, in_modes = None, False
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if sep:
            in_modes = key.strip() == "Supported link modes"
            line = rest
        if in_modes:
            for mbps in _MODE.findall(line):
                best = max(best or 0, int(mbps))
    return best * 1e6 / 8 if best else None


class _Files:
    """Small sysfs reads: None for a file that is absent or unreadable (EINVAL from `speed` on a
    link that is down), None and one more `invalid` for content that is not what the kernel writes."""

    def __init__(self) -> None:
        self.invalid = 0

    @staticmethod
    def text(path: str) -> str | None:
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                return fh.read(4096).strip()
        except OSError:
            return None

    def parsed(self, path: str, parse: Callable[[str], object]):
        raw = self.text(path)
        if raw is None:
            return None
        value = parse(raw)
        if value is None:
            self.invalid += 1
        return value

    def integer(self, path: str, low: int = 0) -> int | None:
        def parse(raw: str):
            try:
                v = int(raw)
            except ValueError:
                return None
            return v if v >= low else None
        return self.parsed(path, parse)


# --- RDMA devices and interface selection -----------------------------------------------------------
def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _gid_netdev(ndevs: str) -> str | None:
    """The netdev of a RoCE port: the name at GID index 0 (the default GID), else the first of a few."""
    def at(index: str) -> str | None:
        text = _Files.text(os.path.join(ndevs, index))
        return text if text and INTERFACE_NAME.fullmatch(text) else None

    found = at("0")
    if found is None:  # unset entries read as EINVAL: look a little further, never through all 255
        others = sorted((n for n in _listdir(ndevs) if n.isdigit() and n != "0"), key=int)[:7]
        found = next((name for name in map(at, others) if name), None)
    return found


def rdma_devices(sysfs_root: str = "/sys") -> dict[str, list[tuple[int, str | None]]]:
    """{RDMA device: [(port, the netdev it carries or None)]} from /sys/class/infiniband."""
    root = os.path.join(sysfs_root, "class", "infiniband")
    out: dict[str, list[tuple[int, str | None]]] = {}
    for dev in _listdir(root):
        ports = sorted(int(p) for p in _listdir(os.path.join(root, dev, "ports")) if p.isdigit())
        netdevs = _listdir(os.path.join(root, dev, "device", "net"))
        out[dev] = []
        for port in ports:
            netdev = _gid_netdev(os.path.join(root, dev, "ports", str(port), "gid_attrs", "ndevs"))
            if netdev is None and len(ports) == 1 and len(netdevs) == 1:
                netdev = netdevs[0]  # one port, one netdev on the PCI function: they are each other's
            out[dev].append((port, netdev))
    return out


@dataclass(frozen=True)
class NcclList:
    """An NCCL interface or HCA list: `^` first excludes, then `=` makes names exact (else prefixes);
    items are `name` or `name:port` (NVIDIA/nccl src/misc/socket.cc and utils.cc)."""

    exclude: bool
    exact: bool
    items: tuple[tuple[str, int | None], ...]

    def matches(self, name: str, port: int | None = None) -> bool:
        """Whether `name` (and `port`) is one the list names, before the exclusion is applied."""
        for item, item_port in self.items:
            if (name == item if self.exact else name.startswith(item)) and (
                    item_port is None or port is None or item_port == port):
                return True
        return False

    def admits(self, name: str, port: int | None = None) -> bool:
        """Whether NCCL may use `name`: every name when the list is empty."""
        if not self.items:
            return True
        return self.matches(name, port) != self.exclude


def parse_nccl_list(value: str | None) -> NcclList:
    s = (value or "").strip()
    exclude = s.startswith("^")
    s = s[1:] if exclude else s
    exact = s.startswith("=")
    s = s[1:] if exact else s
    items = []
    for part in s.split(","):
        name, sep, port = part.strip().partition(":")
        if not name:
            continue
        items.append((name, int(port) if sep and port.isdigit() else None))
    return NcclList(exclude, exact, tuple(items))


def select_interfaces(setting: str, environ: Mapping[str, str], sysfs_root: str = "/sys") -> list[Selected]:
    """The interfaces to follow, at most MAX_INTERFACES, in this order:

    * `setting` a comma list (the `links` setting): those names;
    * `auto`: every netdev an RDMA port carries (only the HCAs NCCL_IB_HCA admits, where set), then
      the interfaces NCCL_SOCKET_IFNAME names (its prefixes matched against /sys/class/net; a name
      that matches nothing is kept, absent; a `^` list excludes and so selects nothing), then
      GLOO_SOCKET_IFNAME's (exact names).  Never `lo`;
    * `off` (or empty): none.
    """
    s = (setting or "").strip()
    if not s or s.lower() == "off":
        return []
    rdma = {netdev: (dev, port) for dev, ports in rdma_devices(sysfs_root).items()
            for port, netdev in ports if netdev}
    out: dict[str, Selected] = {}

    def add(name: str, why: str) -> None:
        if name not in out and INTERFACE_NAME.fullmatch(name) and len(out) < MAX_INTERFACES:
            out[name] = Selected(name, why, rdma.get(name))

    if s.lower() != "auto":
        for name in s.split(","):
            add(name.strip(), LINKS_SETTING)
        return list(out.values())
    hca = parse_nccl_list(environ.get(NCCL_IB_HCA))
    for netdev, (dev, port) in rdma.items():
        if netdev != "lo" and hca.admits(dev, port):
            add(netdev, f"rdma {dev} port {port}" + (f" ({NCCL_IB_HCA})" if hca.items else ""))
    sock = parse_nccl_list(environ.get(NCCL_SOCKET_IFNAME))
    if not sock.exclude:
        present = [n for n in _listdir(os.path.join(sysfs_root, "class", "net")) if n != "lo"]
        for item, _port in sock.items:
            found = [n for n in present if (n == item if sock.exact else n.startswith(item))]
            for name in found or ([item] if item != "lo" else []):
                add(name, NCCL_SOCKET_IFNAME)
    for name in (environ.get(GLOO_SOCKET_IFNAME) or "").split(","):
        if name.strip() != "lo":
            add(name.strip(), GLOO_SOCKET_IFNAME)
    return list(out.values())


def rdma_port_for(interface: str, sysfs_root: str = "/sys") -> tuple[str, int] | None:
    """The (RDMA device, port) that carries `interface`, for a caller with only its name."""
    for dev, ports in rdma_devices(sysfs_root).items():
        for port, netdev in ports:
            if netdev == interface:
                return dev, port
    return None


# --- one interface ----------------------------------------------------------------------------------
def read_pcie(device_dir: str, files: _Files | None = None) -> PcieLink | None:
    """The PCI function at `device_dir` (a /sys/devices/pci... directory); None when not PCI."""
    address = os.path.basename(os.path.realpath(device_dir))
    if not _PCI_ADDRESS.match(address):
        return None
    f = files or _Files()

    def width(name: str) -> int | None:
        v = f.integer(os.path.join(device_dir, name))
        return v if v is not None and 1 <= v <= 32 else None  # 0 and 255: the kernel does not know

    def speed(name: str) -> float | None:
        raw = f.text(os.path.join(device_dir, name))
        if raw is None or raw.lower().startswith("unknown"):
            return None
        v = parse_pcie_speed(raw)
        if v is None:
            f.invalid += 1
        return v

    return PcieLink(address, speed("current_link_speed"), speed("max_link_speed"),
                    width("current_link_width"), width("max_link_width"))


def _netdev_speed(raw: str) -> float | None:
    """`speed` (Mb/s) -> bytes/s; 0.0 for "not known" (-1 is SPEED_UNKNOWN), None when malformed."""
    try:
        mbps = int(raw)
    except ValueError:
        return None
    if mbps in (-1, 0):
        return 0.0
    return mbps * 1e6 / 8 if mbps > 0 else None


def _read_rdma(link: Link, f: _Files, port_dir: str) -> None:
    """Port counters (x 4: they count 4-byte words), and the rate where the netdev has none; netdev
    statistics stay when either counter cannot be read, so a half-read port never mixes sources."""
    tx = f.integer(os.path.join(port_dir, "counters", "port_xmit_data"))
    rx = f.integer(os.path.join(port_dir, "counters", "port_rcv_data"))
    if tx is not None and rx is not None:
        link.tx_bytes, link.rx_bytes = tx * RDMA_WORD_BYTES, rx * RDMA_WORD_BYTES
        link.counter_source = RDMA
    state = f.text(os.path.join(port_dir, "state")) or ""
    if link.rate_bytes_per_second is None and state.endswith(": ACTIVE"):  # a port not ACTIVE has no rate yet
        link.rate_bytes_per_second = f.parsed(os.path.join(port_dir, "rate"), parse_rate)


def read_link(interface: str, sysfs_root: str = "/sys", rdma: tuple[str, int] | None = None,
              port_rates: "PortRates | None" = None) -> Link:
    """Everything sysfs says about `interface`; `rdma`: the (device, port) that carries it (from
    `Selected.rdma` or `rdma_port_for`); `port_rates`: where the port's best rate comes from (none:
    not looked up)."""
    net = os.path.join(sysfs_root, "class", "net", interface)
    link = Link(interface, INTERFACE_NAME.fullmatch(interface) is not None and os.path.isdir(net))
    if not link.exists:
        return link
    f = _Files()
    state = f.text(os.path.join(net, "operstate"))
    if state is not None:
        link.operstate = state if state in OPERSTATES else None
        f.invalid += link.operstate is None
    link.rate_bytes_per_second = f.parsed(os.path.join(net, "speed"), _netdev_speed) or None
    link.carrier_changes = f.integer(os.path.join(net, "carrier_changes"))
    link.ifindex = f.integer(os.path.join(net, "ifindex"), low=1)
    link.tx_bytes = f.integer(os.path.join(net, "statistics", "tx_bytes"))
    link.rx_bytes = f.integer(os.path.join(net, "statistics", "rx_bytes"))
    link.counter_source = NETDEV if link.tx_bytes is not None and link.rx_bytes is not None else None
    device = os.path.join(net, "device")
    if os.path.isdir(device):
        try:
            link.driver = os.path.basename(os.readlink(os.path.join(device, "driver")))
        except OSError:
            pass
        link.pcie = read_pcie(device, f)
    if rdma is not None:
        link.rdma_device, link.rdma_port = rdma
        _read_rdma(link, f, os.path.join(sysfs_root, "class", "infiniband", rdma[0], "ports", str(rdma[1])))
    if port_rates is not None:
        link.port_rate_bytes_per_second = port_rates.get(interface)
    link.invalid = f.invalid
    return link


# --- the port's best rate ---------------------------------------------------------------------------
def ethtool_port_rate(interface: str, timeout: float = ETHTOOL_TIMEOUT_SECONDS, run=subprocess.run) -> float | None:
    """`ethtool IFACE`'s fastest supported link mode, bytes/s; None without ethtool, on a timeout, or
    when the driver reports no modes (veth, most virtual devices)."""
    path = os.pathsep.join(p for p in (os.environ.get("PATH", ""), "/usr/sbin", "/sbin") if p)
    binary = shutil.which("ethtool", path=path)
    if binary is None or not INTERFACE_NAME.fullmatch(interface):
        return None
    try:
        done = run([binary, interface], capture_output=True, text=True, timeout=timeout,
                   env={"LC_ALL": "C", "PATH": path})
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ethtool_supported(done.stdout or "")


class PortRates:
    """The port's best rate per interface, looked up once (it is a property of the port and the
    module, not of the moment): at most one `ethtool` run per interface for the process's life."""

    def __init__(self, lookup: Callable[[str], float | None] = ethtool_port_rate) -> None:
        self._lookup = lookup
        self._cache: dict[str, float | None] = {}

    def get(self, interface: str) -> float | None:
        if interface not in self._cache:
            try:
                self._cache[interface] = self._lookup(interface)
            except Exception:  # a lookup that fails is a rate not known, never a failed sample
                self._cache[interface] = None
        return self._cache[interface]


# --- kernel-log messages ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LinkEvent:
    """One link message: its kind, the parent device it names (a NIC's PCI address) and the netdev."""

    kind: str
    device: str | None
    interface: str | None


# How the kernel prefixes them: dev_printk "DRIVER DEVICE: ", netdev_printk "DRIVER DEVICE IFACE: "
# (with " (unregistering)" and the like after IFACE) or "IFACE: " without a parent (net/core/dev.c
# __netdev_printk).  A netdev name has no ':' (net/core/dev.c dev_valid_name).
_NETDEV = re.compile(r"^(?P<driver>\S+) (?P<device>\S*[^\s:]) (?P<iface>[^\s:()]{1,15})(?: \([a-z ]+\))?: (?P<text>.*)$")
_DEV = re.compile(r"^(?P<driver>\S+) (?P<device>\S*[^\s:]): (?P<text>.*)$")
_BARE = re.compile(r"^(?P<iface>[^\s:()]{1,15}): (?P<text>.*)$")
_TEXT_PREFIX = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?")  # dmesg's [   12.345678] or [Mon Sep  1 ...]
# mlx5 "Link up"/"Link down" (en_main.c), phylib/phylink "Link is Up - ..."/"Link is Down" (phy.c,
# phylink.c), Intel and Broadcom drivers' "NIC Link is Up ...".
_FLAP = re.compile(r"^(?:NIC )?Link (?:is )?(up|down)\b", re.IGNORECASE)


def parse_link_message(message: str) -> LinkEvent | None:
    """One kernel-log message (a /dev/kmsg record's text, or a `dmesg` / `journalctl -k` line) ->
    the link event it reports, or None."""
    if "ink" not in message and "firmware version" not in message and "PCIe bandwidth" not in message:
        return None   # the common case, cheaply
    line = message.split(" kernel: ", 1)[-1] if " kernel: " in message else message
    line = _TEXT_PREFIX.sub("", line, count=1).rstrip()
    m = _NETDEV.match(line) or _DEV.match(line) or _BARE.match(line)
    if m is None:
        return None
    g = m.groupdict()
    text, driver = g["text"], g.get("driver") or ""
    if text.startswith("firmware version: ") and driver.startswith("mlx5"):
        kind = NIC_REINIT   # mlx5 main.c mlx5_function_enable: every (re)initialisation prints it
    elif "available PCIe bandwidth, limited by" in text:
        kind = PCIE_DEGRADED  # drivers/pci/pci.c __pcie_print_link_status
    else:
        flap = _FLAP.match(text)
        if flap is None:
            return None
        kind = LINK_UP if flap.group(1).lower() == "up" else LINK_DOWN
    return LinkEvent(kind, g.get("device"), g.get("iface"))


def classify_link_message(message: str) -> str | None:
    """The kind (one of LINK_EVENT_KINDS) of a kernel-log message, or None."""
    event = parse_link_message(message)
    return event.kind if event else None
