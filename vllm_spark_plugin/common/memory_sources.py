"""Parsers for the sources that explain a unified-memory failure on a Spark (imports nothing from vLLM).

On GB10 the host signals the plugin already exports (MemTotal/MemAvailable, PSI) can look healthy
while the driver fails allocations (vllm #56824, #54200).  Three more sources tell the story:

* the kernel log: the NVIDIA driver's `NVRM:` lines, `NV_ERR_NO_MEMORY` and `Xid` events, read from
  `/dev/kmsg` (one record per read: `prio,seq,usec,flags;message`) or from `dmesg` / `journalctl -k`
  text.  The same records carry the NICs' link messages, counted here too (`KernelLog.links`, by
  `link_sources.parse_link_message`) so that the log is read once;
* the parts of `/proc/meminfo` that say where memory went: MemFree, Cached, Buffers, SReclaimable,
  Shmem, swap.  `cudaMemGetInfo` on a unified-memory device reports MemFree, so page cache counts as
  used for vLLM's own start-up check (vllm #48140), while MemAvailable counts it as free;
* `/proc/pressure/memory` (PSI): `some` and `full` stall shares.

Every parser returns what it could read plus a count of invalid lines; malformed or truncated input
never raises.  `KmsgReader` reads the kernel log incrementally without blocking.
"""
from __future__ import annotations

import errno
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field

from vllm_spark_plugin.common import link_sources

# /proc/meminfo fields exported beside MemTotal/MemAvailable (kernel names, values in bytes).
MEMINFO_FIELDS = ("MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "SReclaimable", "Shmem",
                  "SwapTotal", "SwapFree")
MEMINFO_REQUIRED = ("MemTotal", "MemFree", "MemAvailable")
PSI_KINDS = ("some", "full")
PSI_WINDOWS = ("avg10", "avg60", "avg300")
NV_ERR_NO_MEMORY = "nv_err_no_memory"
XID = "xid"
KERNEL_EVENT_KINDS = (NV_ERR_NO_MEMORY, XID)
KMSG_PATH = "/dev/kmsg"

_XID = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)(?:,|$)")
_XID_MAX = 1023  # Xid codes documented by NVIDIA are 1-170; a larger number is a corrupt line


# --- /proc/meminfo ----------------------------------------------------------------------------------
@dataclass
class Meminfo:
    """Bytes by kernel field name; `invalid` counts lines that could not be read."""

    values: dict[str, int] = field(default_factory=dict)
    invalid: int = 0

    @property
    def complete(self) -> bool:
        return all(k in self.values for k in MEMINFO_REQUIRED)

    def reclaimable_bytes(self) -> int | None:
        """What dropping caches can give back: page cache (Cached + Buffers) less Shmem (tmpfs and
        shared memory live in Cached but cannot be dropped), plus reclaimable slab."""
        v = self.values
        if "Cached" not in v:
            return None
        cache = v["Cached"] + v.get("Buffers", 0) - v.get("Shmem", 0)
        return max(0, cache) + v.get("SReclaimable", 0)

    def headroom_bytes(self) -> int | None:
        """Free memory plus what is reclaimable: what a new allocation could get after caches drop."""
        rec = self.reclaimable_bytes()
        if rec is None or "MemFree" not in self.values:
            return None
        return self.values["MemFree"] + rec


def parse_meminfo(text: str) -> Meminfo:
    """`/proc/meminfo` text -> bytes per field.  A line that is not `Key: <int> [kB]`, a negative
    value, or a last line cut short (no final newline) is counted invalid and left out."""
    out = Meminfo()
    lines = text.split("\n")
    truncated = bool(text) and not text.endswith("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if truncated and i == len(lines) - 1:
            out.invalid += 1
            continue
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not key.strip() or not parts or len(parts) > 2:
            out.invalid += 1
            continue
        try:
            value = int(parts[0])
        except ValueError:
            out.invalid += 1
            continue
        unit = parts[1].lower() if len(parts) == 2 else ""
        if value < 0 or unit not in ("", "kb"):
            out.invalid += 1
            continue
        out.values[key.strip()] = value * 1024 if unit == "kb" else value
    return out


# --- /proc/pressure/memory --------------------------------------------------------------------------
@dataclass
class Psi:
    """{(kind, window): share of time 0-1}, {kind: total stall seconds}, invalid lines."""

    ratios: dict[tuple[str, str], float] = field(default_factory=dict)
    stall_seconds: dict[str, float] = field(default_factory=dict)
    invalid: int = 0


def parse_psi(text: str) -> Psi:
    """`some avg10=0.00 avg60=0.00 avg300=0.00 total=0` lines (total in microseconds)."""
    out = Psi()
    lines = text.split("\n")
    truncated = bool(text) and not text.endswith("\n")
    for i, line in enumerate(lines):
        parts = line.split()
        if not parts:
            continue
        kind = parts[0]
        if kind not in PSI_KINDS or (truncated and i == len(lines) - 1):
            out.invalid += 1
            continue
        items = {}
        for item in parts[1:]:
            k, sep, v = item.partition("=")
            try:
                items[k] = float(v) if sep else None
            except ValueError:
                items[k] = None
        if set(items) != set(PSI_WINDOWS) | {"total"} or any(v is None or v < 0 for v in items.values()) \
                or any(items[w] > 100 for w in PSI_WINDOWS):
            out.invalid += 1
            continue
        for w in PSI_WINDOWS:
            out.ratios[(kind, w)] = items[w] / 100.0
        out.stall_seconds[kind] = items["total"] / 1e6
    return out


# --- kernel log -------------------------------------------------------------------------------------
@dataclass
class KernelLog:
    """Driver events found in kernel-log input: counts by kind, Xid counts by code, link messages,
    invalid records."""

    events: Counter = field(default_factory=Counter)     # kind -> count
    xids: Counter = field(default_factory=Counter)       # Xid code -> count
    links: Counter = field(default_factory=Counter)      # link_sources.LinkEvent -> count
    invalid: int = 0
    records: int = 0
    lost: int = 0        # records the kernel overwrote before they were read (/dev/kmsg EPIPE)

    def add(self, other: "KernelLog") -> None:
        self.events.update(other.events)
        self.xids.update(other.xids)
        self.links.update(other.links)
        self.invalid += other.invalid
        self.records += other.records
        self.lost += other.lost


def classify(message: str, into: KernelLog) -> None:
    """Count one kernel-log message: NV_ERR_NO_MEMORY, an Xid (by code), a NIC link event, or nothing.
    An `NVRM: Xid` line without a readable code (cut short) is invalid."""
    if "NVRM:" not in message:
        link = link_sources.parse_link_message(message)
        if link is not None:
            into.links[link] += 1
        return
    if "NV_ERR_NO_MEMORY" in message:
        into.events[NV_ERR_NO_MEMORY] += 1
        return
    if "NVRM: Xid" not in message:
        return
    m = _XID.search(message)
    if m is None or not 0 < int(m.group(2)) <= _XID_MAX:
        into.invalid += 1
        return
    into.events[XID] += 1
    into.xids[int(m.group(2))] += 1


def parse_kmsg_record(record: str, into: KernelLog, kernel_only: bool = True) -> None:
    """One `/dev/kmsg` record: `prio,seq,usec,flags[,...];message` plus continuation lines that
    start with a space (device properties, ignored).  With `kernel_only`, records that user space
    wrote (facility other than 0, `prio >> 3`) are read but not counted, so `echo ... > /dev/kmsg`
    cannot fake a driver event."""
    head, sep, rest = record.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 4:
        into.invalid += 1
        return
    try:
        prio, _seq, _usec = (int(f) for f in fields[:3])
    except ValueError:
        into.invalid += 1
        return
    into.records += 1
    if kernel_only and prio >> 3 != 0:
        return
    classify(rest.split("\n", 1)[0], into)


def parse_kernel_text(text: str) -> KernelLog:
    """`dmesg` (`[  12.345678] NVRM: ...`, `dmesg -T`), `journalctl -k` (`Sep 14 23:16:52 host
    kernel: NVRM: ...`) or `/dev/kmsg` dump text, one message per line.  Lines wrapped by a viewer
    (no `NVRM:` on them) are skipped."""
    out = KernelLog()
    for line in text.splitlines():
        if not line.strip():
            continue
        if _looks_like_kmsg(line):
            parse_kmsg_record(line, out, kernel_only=False)
            continue
        out.records += 1
        classify(line, out)
    return out


_KMSG_HEAD = re.compile(r"^\d+,\d+,\d+,[^;]*;")


def _looks_like_kmsg(line: str) -> bool:
    return _KMSG_HEAD.match(line) is not None


class KmsgReader:
    """Incremental, non-blocking reader of `/dev/kmsg` (or a plain file written in its format).

    `open()` seeks to the end, so only records logged after it are counted; `read_new()` returns
    what arrived since the last call and never blocks (EAGAIN ends a round; EPIPE, records the kernel
    overwrote before we read them, is counted as `lost` and reading goes on).  At most `max_records`
    per call, so a log storm cannot hold the telemetry thread.
    """

    def __init__(self, path: str = KMSG_PATH, max_records: int = 10_000, from_start: bool = False) -> None:
        self.path = path
        self.max_records = max_records
        self.from_start = from_start
        self.fd: int | None = None
        self._partial = b""

    def open(self) -> None:
        """Raises OSError (FileNotFoundError, PermissionError, ...) when the log cannot be read."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode):  # opens, but can never be read
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), self.path)
            if not self.from_start:
                os.lseek(fd, 0, os.SEEK_END)
        except OSError:
            os.close(fd)
            raise
        self.fd = fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read_new(self) -> KernelLog:
        out = KernelLog()
        if self.fd is None:
            return out
        for _ in range(self.max_records):
            try:
                chunk = os.read(self.fd, 8192)  # /dev/kmsg returns exactly one record per read
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    out.lost += 1
                    continue
                raise
            if not chunk:
                break  # end of a plain file
            self._consume(self._partial + chunk, out)
        return out

    def _consume(self, data: bytes, out: KernelLog) -> None:
        *complete, self._partial = data.split(b"\n")
        for raw in complete:
            if raw.startswith(b" ") or not raw:
                continue  # continuation line of the record before (SUBSYSTEM=..., DEVICE=...)
            parse_kmsg_record(raw.decode("utf-8", "replace"), out)
