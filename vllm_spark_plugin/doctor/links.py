"""`vllm-spark doctor`: the network links a multi-node deployment runs over (a row of doctor.registry).

* link_named  - the interfaces NCCL_SOCKET_IFNAME, NCCL_IB_HCA, GLOO_SOCKET_IFNAME and SPARK_PLUGIN_LINKS
                name: each must exist and be up, or NCCL fails or falls back to another interface;
* link_rdma   - an RDMA device where the deployment spans nodes: without one NCCL runs its collectives
                over TCP sockets;
* link_rate   - each followed link's negotiated rate against the best its port supports (`ethtool`);
* link_pcie   - each NIC's PCIe link against what the function supports (a link that trained narrower
                or slower caps the port below its rate);
* link_flaps  - links that went down since boot: carrier changes beyond a clean start, "Link up"
                more than once, and NIC (re)initialisations in the kernel log.

The links followed are `link_sources.select_interfaces` (the `links` setting: RDMA ports and the
NCCL/Gloo interfaces).  On a single box (nothing selected, nothing named, serve arguments within this
box) every check is one `n/a`.  Multi-node is read from the serve arguments (`multi_node`).
Seams: `Probe.extra["sysfs_root"]` (default /sys), `["kernel_log_path"]` (default /dev/kmsg),
`["port_rate"]` (interface -> bytes/s, default `ethtool`), `["gpu_count"]` (default: the NVIDIA
driver's /proc/driver/nvidia/gpus entries, at least 1).
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping

from vllm_spark_plugin.common import link_sources as ls
from vllm_spark_plugin.common import memory_sources as ms

# A clean start counts at most two carrier changes: the carrier-off when the interface opens (mlx5:
# mlx5e_open_locked -> mlx5e_update_carrier, "Link down" while the port is not up yet) and the link
# coming up; a fresh veth and this suite's machines read 2.  Every flap adds two more (down, then up),
# so more than two is a link that went down.  For the same reason one "Link down" in the kernel log is
# normal and "Link up" more than once is not.  A NIC re-initialised after a hot-plug gets a new netdev
# whose counter starts again: only the kernel log shows that (a second "firmware version:" line).
CLEAN_CARRIER_CHANGES = 2
_DOWN = ("down", "lowerlayerdown", "notpresent")
_KMSG_ROUNDS = 20   # KmsgReader reads at most 10,000 records per call: the whole ring buffer, bounded
NAMING_VARIABLES = (ls.NCCL_SOCKET_IFNAME, ls.NCCL_IB_HCA, ls.GLOO_SOCKET_IFNAME)


def diagnosis(rdma_device: str | None = None) -> str:
    """The seed's diagnosis of a slow ring link, step by step (docs/links.md)."""
    dev = rdma_device or "DEV"
    return (f"walk the slow-link diagnosis (docs/links.md): 1. an RDMA loopback test on this host "
            f"(`ib_write_bw -d {dev}` in one shell, `ib_write_bw -d {dev} localhost` in another): as slow "
            "without a cable means the host's NIC path, not the cable; 2. the kernel log for NIC "
            "reinitialisation (`sudo dmesg | grep -E 'mlx5_core.*(firmware version|Link (up|down))'`: a "
            "second firmware-version line for one PCI function is a reinitialisation, e.g. after a hot-plug); "
            "3. if it was reinitialised, reboot with the cables connected")


DIAGNOSIS = diagnosis()


def checks(env: Mapping[str, str], serve, probe, setting: str = "auto") -> list:
    """The link checks; one `links` n/a on a single box."""
    from vllm_spark_plugin.doctor import check as d

    sysfs = probe.extra.get("sysfs_root", "/sys")
    argv = list(getattr(serve, "argv", None) or [])
    multi = multi_node(argv, gpu_count(probe))
    selected = ls.select_interfaces(setting, env, sysfs)
    named = [v for v in NAMING_VARIABLES if (env.get(v) or "").strip()]
    if not selected and multi is None and not named:
        why = "SPARK_PLUGIN_LINKS=off" if setting == "off" else (
            "no RDMA device, none of " + ", ".join(NAMING_VARIABLES) + " set")
        return [d.Check("links", d.NA, f"single box: no link to check ({why}) and the serve arguments run on "
                        "this box alone (pass them after -- to check a multi-node deployment)")]
    rates = ls.PortRates(probe.extra.get("port_rate", ls.ethtool_port_rate))
    links = [ls.read_link(s.interface, sysfs, s.rdma, rates) for s in selected]
    found = [link for link in links if link.exists]
    log = _kernel_links(probe.extra.get("kernel_log_path", ms.KMSG_PATH)) if found else (None, "")
    out = []
    for name, fn, args in (("link_named", _named, (env, setting, sysfs, multi)),
                           ("link_rdma", _rdma, (sysfs, multi)),
                           ("link_rate", _rate, (found,)),
                           ("link_pcie", _pcie, (found, log[0])),
                           ("link_flaps", _flaps, (found, log))):
        out += d.contained(name, fn, *args)  # one broken check hides no other
    return out


# --- is the deployment multi-node? -------------------------------------------------------------------
def gpu_count(probe) -> int:
    """GPUs on this box: `Probe.extra["gpu_count"]`, else the NVIDIA driver's entries; at least 1 (a Spark has one)."""
    given = probe.extra.get("gpu_count")
    if given is not None:
        return max(1, int(given))
    try:
        return max(1, len(os.listdir("/proc/driver/nvidia/gpus")))
    except OSError:
        return 1


def _flag(argv: list[str], *names: str) -> str | None:
    """The value of the last of `names` in argv (`--x V` or `--x=V`); "" for a flag given without one."""
    value = None
    for i, a in enumerate(argv):
        key, eq, val = a.partition("=")
        if key in names:
            value = val if eq else (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else "")
    return value


def _int(argv: list[str], *names: str, default: int = 1) -> int:
    raw = _flag(argv, *names)
    try:
        return int(raw) if raw else default
    except ValueError:
        return default   # vLLM itself refuses it; this check has nothing to add


def multi_node(argv: list[str], gpus: int = 1) -> str | None:
    """Why the `vllm serve` arguments span more than this box, or None.  Read as vLLM does:

    * `--nnodes N` (`-n`) above 1, or `--headless` (a secondary node);
    * data parallel across nodes: `--data-parallel-address` (`-dpa`), `--data-parallel-start-rank`
      (`-dpr`) above 0, or `--data-parallel-size-local` (`-dpl`) below `--data-parallel-size` (`-dp`);
    * more ranks than this box has GPUs: tensor x pipeline x local data-parallel size (`-tp`, `-pp`,
      `-dp`/`-dpl`) above `gpus` (a Spark has one GPU, so `-tp 2` is two Sparks).
    Ray alone is not multi-node (it runs on one box too); NCCL variables name interfaces and are
    checked as such, not taken as a node count."""
    nnodes = _int(argv, "--nnodes", "-n")
    if nnodes > 1:
        return f"--nnodes {nnodes}"
    if _flag(argv, "--headless") is not None:
        return "--headless (a secondary node)"
    if _flag(argv, "--data-parallel-address", "-dpa"):
        return f"--data-parallel-address {_flag(argv, '--data-parallel-address', '-dpa')}"
    start = _int(argv, "--data-parallel-start-rank", "-dpr", default=0)
    if start > 0:
        return f"--data-parallel-start-rank {start}"
    dp = _int(argv, "--data-parallel-size", "-dp")
    local = _int(argv, "--data-parallel-size-local", "-dpl", default=dp)
    if local < dp:
        return f"--data-parallel-size-local {local} of --data-parallel-size {dp}"
    tp, pp = _int(argv, "--tensor-parallel-size", "-tp"), _int(argv, "--pipeline-parallel-size", "-pp")
    ranks = tp * pp * local
    if ranks > gpus:
        return (f"--tensor-parallel-size {tp} x --pipeline-parallel-size {pp}"
                + (f" x --data-parallel-size {local}" if local > 1 else "")
                + f" = {ranks} GPUs, this box has {gpus}")
    return None


# --- link_named ----------------------------------------------------------------------------------------
def _interfaces(sysfs: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(os.path.join(sysfs, "class", "net")) if n != "lo")
    except OSError:
        return []


def _state(link: ls.Link) -> str:
    return link.operstate or "unknown"


def _named(env, setting: str, sysfs: str, multi: str | None) -> list:
    """Each interface or HCA a variable names: absent or down is a failure (named, so meant to carry traffic)."""
    from vllm_spark_plugin.doctor import check as d

    present = _interfaces(sysfs)
    rdma = ls.rdma_devices(sysfs)
    lists = [(v, ls.parse_nccl_list(env.get(v))) for v in (ls.NCCL_SOCKET_IFNAME, ls.NCCL_IB_HCA)]
    lists.append((ls.GLOO_SOCKET_IFNAME, _exact(env.get(ls.GLOO_SOCKET_IFNAME) or "")))
    if setting not in ("auto", "off"):
        lists.append((ls.LINKS_SETTING, _exact(setting)))
    lists = [(v, nl) for v, nl in lists if nl.items]
    if not lists:
        if multi is None:
            return [d.Check("link_named", d.NA, "none of " + ", ".join(NAMING_VARIABLES) + " is set")]
        return [d.Check("link_named", d.INFO, f"multi-node ({multi}) but none of " + ", ".join(NAMING_VARIABLES)
                        + " is set: NCCL and Gloo choose the interface themselves, and may choose the "
                        "management port instead of the ConnectX-7",
                        "on every node export NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME=<the ConnectX-7 interface> "
                        "(`ibdev2netdev` or `ip -br link` lists them)")]
    fine, problems = [], []
    for var, nl in lists:
        value = env.get(var) if var != ls.LINKS_SETTING else setting
        if nl.exclude:
            fine.append(f"{var}={value!r} (an exclusion list: not checked)")
            continue
        found = [(_named_hca(item, port, nl.exact, rdma, sysfs) if var == ls.NCCL_IB_HCA else
                  _named_interface(item, nl.exact, present, sysfs)) for item, port in nl.items]
        bad = [text for ok, text in found if not ok]
        (problems if bad else fine).append(f"{var}={value!r}: " + ", ".join(bad or [text for _, text in found]))
    if problems:
        return [d.Check("link_named", d.FAIL, "; ".join(problems),
                        "point the variable at the interface that carries the deployment (`ibdev2netdev` maps "
                        "RDMA devices to interfaces, `ip -br link` lists them), or bring the named one up: connect "
                        "its cable, `sudo ip link set IF up`, check `ethtool IF` on both ends")]
    return [d.Check("link_named", d.OK, "; ".join(fine))]


def _exact(names: str) -> ls.NcclList:
    """A plain comma list of exact names (Gloo's variable, the links setting)."""
    return ls.NcclList(False, True, tuple((n.strip(), None) for n in names.split(",") if n.strip()))


def _named_interface(item: str, exact: bool, present: list[str], sysfs: str) -> tuple[bool, str]:
    matches = [n for n in present if (n == item if exact else n.startswith(item))]
    if not matches:
        here = ", ".join(present) or "none"
        return False, f"no interface {'named' if exact else 'starting with'} {item} (interfaces here: {here})"
    states = {n: _state(ls.read_link(n, sysfs)) for n in matches}
    up = [n for n, s in states.items() if s not in _DOWN]
    return bool(up), ", ".join(f"{n} is {s}" for n, s in states.items())


def _named_hca(item: str, port: int | None, exact: bool, rdma: dict, sysfs: str) -> tuple[bool, str]:
    devices = [dev for dev in rdma if (dev == item if exact else dev.startswith(item))]
    if not devices:
        here = ", ".join(rdma) or "none"
        return False, f"no RDMA device {'named' if exact else 'starting with'} {item} (RDMA devices here: {here})"
    ports = [(dev, p, netdev) for dev in devices for p, netdev in rdma[dev] if port is None or p == port]
    if not ports:
        return False, f"{', '.join(devices)} has no port {port}"
    states = {(dev, p, netdev): (_state(ls.read_link(netdev, sysfs)) if netdev else "no interface")
              for dev, p, netdev in ports}
    up = [k for k, s in states.items() if s not in _DOWN and s != "no interface"]
    return bool(up), ", ".join(f"{dev} port {p} ({netdev or 'no interface'}) is {s}"
                               for (dev, p, netdev), s in states.items())


# --- link_rdma ---------------------------------------------------------------------------------------------
def _rdma(sysfs: str, multi: str | None) -> list:
    from vllm_spark_plugin.doctor import check as d

    rdma = ls.rdma_devices(sysfs)
    listed = ", ".join(f"{dev} port {p} ({netdev or '-'})" for dev, ports in rdma.items() for p, netdev in ports)
    if multi is None:
        return [d.Check("link_rdma", d.NA, "the serve arguments run on this box alone"
                        + (f" (RDMA here: {listed})" if rdma else ""))]
    if rdma:
        return [d.Check("link_rdma", d.OK, f"multi-node ({multi}); RDMA: {listed}")]
    return [d.Check("link_rdma", d.WARN, f"multi-node ({multi}) but {sysfs}/class/infiniband lists no RDMA device: "
                    "NCCL runs its collectives over TCP sockets, a fraction of the ConnectX-7's rate",
                    "load the RDMA driver (`sudo modprobe mlx5_ib`; `ibdev2netdev` should list the ports), and in "
                    "a container pass the devices in (--device /dev/infiniband, --network host)")]


# --- link_rate -----------------------------------------------------------------------------------------
def _gbit(bytes_per_second: float) -> str:
    return f"{bytes_per_second * 8 / 1e9:g} Gb/s"


def _rate(links: list[ls.Link]) -> list:
    from vllm_spark_plugin.doctor import check as d

    if not links:
        return [d.Check("link_rate", d.NA, "no followed link exists on this box")]
    parts, slow, unknown = [], [], False
    for link in links:
        name, rate, best = link.interface, link.rate_bytes_per_second, link.port_rate_bytes_per_second
        if _state(link) in _DOWN:
            parts.append(f"{name} down (no cable, or the peer is off)")
        elif rate is None:
            parts.append(f"{name} {_state(link)}, negotiated rate unknown")
            unknown = True
        elif best is None:
            parts.append(f"{name} {_gbit(rate)} (the port's best rate unknown: ethtool missing or silent)")
            unknown = True
        elif rate < best:
            parts.append(f"{name} negotiated {_gbit(rate)}, its port supports {_gbit(best)}")
            slow.append(link)
        else:
            parts.append(f"{name} {_gbit(rate)} of {_gbit(best)}")
    detail = "; ".join(parts)
    unknown = unknown or all(_state(link) in _DOWN for link in links)   # nothing up: nothing to judge
    if slow:
        names = ", ".join(link.interface for link in slow)
        return [d.Check("link_rate", d.WARN, detail,
                        f"{names}: reseat or replace the cable (one rated for the port's speed), check `ethtool IF` on "
                        "both ends (autonegotiation on: `sudo ethtool -s IF autoneg on`); then "
                        + diagnosis(slow[0].rdma_device))]
    return [d.Check("link_rate", d.INFO if unknown else d.OK, detail)]


# --- link_pcie -------------------------------------------------------------------------------------------
def _pcie_gbit(speed_gts: float, width: int) -> float:
    """A PCIe link's data rate, Gb/s: 8b/10b encoding up to 5 GT/s, 128b/130b from 8 GT/s."""
    return speed_gts * width * (0.8 if speed_gts <= 5.0 else 128 / 130)


def _pcie(links: list[ls.Link], events: Counter | None) -> list:
    from vllm_spark_plugin.doctor import check as d

    limited: Counter = Counter()   # "available PCIe bandwidth, limited by" records per PCI function
    for event, n in (events or {}).items():
        if event.kind == ls.PCIE_DEGRADED and event.device:
            limited[event.device] += n
    seen: dict[str, list[str]] = {}
    functions: dict[str, ls.PcieLink] = {}
    for link in links:
        if link.pcie is not None:
            seen.setdefault(link.pcie.address, []).append(link.interface)
            functions[link.pcie.address] = link.pcie
    if not functions:
        return [d.Check("link_pcie", d.NA, "no followed link sits on a PCIe function (virtual interfaces)" if links
                        else "no followed link exists on this box")]
    parts, degraded, unknown = [], [], False
    for address, p in functions.items():
        who = f"{'/'.join(seen[address])} ({address})"
        if p.degraded is None:
            parts.append(f"{who}: PCIe link not reported")
            unknown = True
            continue
        now, best = f"{p.speed_gts:.1f} GT/s x{p.width}", f"{p.max_speed_gts:.1f} GT/s x{p.max_width}"
        logged = (f"; the kernel logged its PCIe bandwidth limited {limited[address]} time(s) since boot"
                  if limited[address] else "")
        if p.degraded:
            parts.append(f"{who}: PCIe {now}, the function supports {best} (about "
                         f"{_pcie_gbit(p.speed_gts, p.width):.0f} of {_pcie_gbit(p.max_speed_gts, p.max_width):.0f} "
                         f"Gb/s){logged}")
            degraded.append(address)
        else:
            parts.append(f"{who}: PCIe {now} (about {_pcie_gbit(p.speed_gts, p.width):.0f} Gb/s){logged}")
    detail = "; ".join(parts)
    if degraded:
        return [d.Check("link_pcie", d.WARN, detail,
                        f"{', '.join(degraded)}: the link trained below what the NIC supports, capping its port: "
                        "`sudo lspci -vv -s ADDRESS` shows LnkSta against LnkCap (and the upstream port's LnkCap: "
                        "a narrower slot is the board's wiring, not a fault); reseat the card or reboot, and check the "
                        "kernel log for 'PCIe bandwidth ... limited by' and for NIC reinitialisation")]
    return [d.Check("link_pcie", d.INFO if unknown else d.OK, detail)]


# --- link_flaps ------------------------------------------------------------------------------------------
def _kernel_links(path: str) -> tuple[Counter | None, str]:
    """The link events in the kernel log since boot (None and why when it cannot be read)."""
    reader = ms.KmsgReader(path, from_start=True)
    total = ms.KernelLog()
    try:
        reader.open()
        for _ in range(_KMSG_ROUNDS):
            got = reader.read_new()
            total.add(got)
            if not got.records:
                break
    except OSError as exc:
        return None, f"the kernel log {path} is not readable ({exc.strerror or exc}): run doctor as root to read it"
    finally:
        reader.close()
    lost = f", {total.lost} lost to the ring buffer" if total.lost else ""
    return total.links, f"{total.records} kernel-log records read{lost}"


def _flaps(links: list[ls.Link], log: tuple[Counter | None, str]) -> list:
    from vllm_spark_plugin.doctor import check as d

    if not links:
        return [d.Check("link_flaps", d.NA, "no followed link exists on this box")]
    events, log_note = log
    ups: Counter = Counter()
    inits: Counter = Counter()
    for event, n in (events or {}).items():
        if event.kind == ls.LINK_UP and event.interface:
            ups[event.interface] += n
        elif event.kind == ls.NIC_REINIT and event.device:
            inits[event.device] += n
    parts, flapped = [], []
    for link in links:
        why = []
        if link.carrier_changes is not None and link.carrier_changes > CLEAN_CARRIER_CHANGES:
            why.append(f"carrier changed {link.carrier_changes} times since boot (a clean start is at most "
                       f"{CLEAN_CARRIER_CHANGES})")
        if ups[link.interface] > 1:
            why.append(f"'Link up' {ups[link.interface]} times in the kernel log")
        address = link.pcie.address if link.pcie else None
        if address and inits[address] > 1:
            why.append(f"its NIC {address} was initialised {inits[address]} times (reinitialised since boot)")
        if why:
            parts.append(f"{link.interface}: " + ", ".join(why))
            flapped.append(link)
        else:
            changes = "unknown" if link.carrier_changes is None else str(link.carrier_changes)
            parts.append(f"{link.interface}: steady (carrier changes {changes})")
    detail = "; ".join(parts) + f" ({log_note})"
    if flapped:
        return [d.Check("link_flaps", d.WARN, detail,
                        f"{', '.join(link.interface for link in flapped)}: a link that went down since boot may have "
                        "come back slower; " + diagnosis(flapped[0].rdma_device))]
    return [d.Check("link_flaps", d.OK if events is not None else d.INFO, detail)]
