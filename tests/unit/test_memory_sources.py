"""Parsers of the unified-memory failure sources, on recorded real formats.

Recorded inputs live in tests/unit/data/memory_sources (see its README for each file's source).
Kernel-log lines are quoted verbatim from the published reports named next to each; where a report
gives only the message, the line is put in /dev/kmsg record form (`prio,seq,usec,flags;message`,
prio 3 = kernel facility 0, level err) as the driver's printk would produce it.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_spark_plugin.common import memory_sources as ms

DATA = Path(__file__).resolve().parent / "data" / "memory_sources"
GIB = 1 << 30

# vllm-project/vllm#56824 and #54200 (DGX Spark GB10, driver 580.173.02 / 580.95.05), and
# NVIDIA/open-gpu-kernel-modules#1358 (`journalctl -k` on a GB10): the message, byte for byte.
GB10_NO_MEMORY = ("NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) "
                  "returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359")
# NVIDIA/dgx-spark-playbooks#97 (GB10 head node, 580.173.02): the same line as the report shows it,
# wrapped after the error name.
GB10_NO_MEMORY_WRAPPED = ("NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY]\n"
                          "(0x00000051) returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359\n")
# NVIDIA/open-gpu-kernel-modules#848 (`dmesg`, RTX 5060 Ti, 575.51.02): raw-timestamp dmesg format,
# one allocation failure logged as three lines, two of them carrying NV_ERR_NO_MEMORY.
DMESG_848 = """\
[52595.758098] NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1353
[52595.759943] NVRM: sysmemConstruct_IMPL: *** Cannot allocate sysmem through fb heap
[52595.760899] NVRM: nvAssertOkFailedNoLog: Assertion failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from pRmApi->Alloc(pRmApi, device->session->handle, isSystemMemory ? device->handle : device->subhandle, &physHandle, isSystemMemory ? NV01_MEMORY_SYSTEM : NV01_MEMORY_LOCAL_USER, &memAllocParams, sizeof(memAllocParams)) @ nv_gpu_ops.c:4647
"""
# leptonai/gpud#46 (`dmesg --ctime`, a data-centre GPU): Xid 13 three times and Xid 109, next to a
# non-NVRM driver line.
DMESG_CTIME_GPUD_46 = """\
[Fri Aug 30 11:11:22 2024] nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing
[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter
[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Global Exception on (GPC 7, TPC 7, SM 0): Multiple Warp Errors
[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x57c730=0xc04000b 0x57c734=0x24 0x57c728=0x1f81fb60 0x57c72c=0x1174
[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005
"""
# akash-network/support#244 (`dmesg -T | grep NVRM`): GPU announce lines (not events), Xid 43 and 31.
DMESG_AKASH_244 = """\
[Wed Jul 31 23:14:18 2024] NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375
[Wed Jul 31 23:14:18 2024] NVRM: GPU Board Serial Number: 1650423013443
[Wed Jul 31 23:14:18 2024] NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008
[Mon Aug  5 03:54:13 2024] NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE
"""
# NVIDIA/open-gpu-kernel-modules#1150 (`journalctl -k` style, `kernel:` prefix): Xid 45.
JOURNAL_1150 = "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149\n"
# leptonai/gpud#1174 ("kmsg input"): an NVLink Xid message as read from /dev/kmsg.
KMSG_XID_149 = "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"


def kmsg(message: str, seq: int = 1, prio: int = 3) -> str:
    return f"{prio},{seq},{1000 * seq},-;{message}"


# --- kernel log ---------------------------------------------------------------------------------
def test_gb10_no_memory_line_in_kmsg_record_form_is_one_event():
    got = ms.KernelLog()
    ms.parse_kmsg_record(kmsg(GB10_NO_MEMORY), got)
    assert got.events == {ms.NV_ERR_NO_MEMORY: 1} and not got.xids and got.invalid == 0 and got.records == 1


def test_gb10_wrapped_line_counts_once():
    got = ms.parse_kernel_text(GB10_NO_MEMORY_WRAPPED)
    assert got.events[ms.NV_ERR_NO_MEMORY] == 1 and got.invalid == 0


def test_dmesg_raw_timestamps_count_each_no_memory_line():
    got = ms.parse_kernel_text(DMESG_848)
    assert got.events == {ms.NV_ERR_NO_MEMORY: 2} and got.records == 3 and got.invalid == 0


def test_dmesg_ctime_xids_counted_by_code():
    got = ms.parse_kernel_text(DMESG_CTIME_GPUD_46 + DMESG_AKASH_244 + JOURNAL_1150)
    assert got.xids == {13: 3, 109: 1, 43: 1, 31: 1, 45: 1}
    assert got.events == {ms.XID: 7}  # "caused by previous Xid 149" is one event, Xid 45
    assert got.invalid == 0


def test_kmsg_xid_record_and_continuation_lines(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text(kmsg(KMSG_XID_149, 7) + "\n SUBSYSTEM=pci\n DEVICE=+pci:0019:01:00.0\n")
    reader = ms.KmsgReader(str(path), from_start=True)
    reader.open()
    got = reader.read_new()
    reader.close()
    assert got.xids == {149: 1} and got.records == 1 and got.invalid == 0


def test_user_space_records_are_read_but_not_counted():
    got = ms.KernelLog()
    ms.parse_kmsg_record(kmsg(GB10_NO_MEMORY, prio=(1 << 3) | 3), got)  # facility 1 = user
    assert got.records == 1 and not got.events


@pytest.mark.parametrize("record", [
    "3,1,1000;NVRM: Xid (PCI:0000:01:00): 13, x",        # header with three fields
    "3,x,1000,-;NVRM: Xid (PCI:0000:01:00): 13, x",     # sequence not a number
    "NVRM: Xid (PCI:0000:01:00): 13, x",                # no header at all
    kmsg("NVRM: Xid (PCI:0000:01:00): "),               # truncated before the code
    kmsg("NVRM: Xid (PCI:0000:01:00): 99999, x"),       # no such code
])
def test_malformed_kmsg_records_are_counted_invalid(record):
    got = ms.KernelLog()
    ms.parse_kmsg_record(record, got)
    assert got.invalid == 1 and not got.events


@pytest.mark.parametrize("line", [
    "[52595.758098] NVRM: Xid (PCI:0000:01:00",          # cut inside the device
    "Sep 14 23:16:52 host kernel: NVRM: Xid (PCI:0000:01:00): ",
])
def test_malformed_text_lines_are_counted_invalid(line):
    got = ms.parse_kernel_text(line + "\n" + DMESG_848)
    assert got.invalid == 1 and got.events == {ms.NV_ERR_NO_MEMORY: 2}


def test_unrelated_and_empty_input():
    assert ms.parse_kernel_text("").records == 0
    got = ms.parse_kernel_text("[    0.0] Linux version 6.18\n[  1.6] EXT4-fs (vda): mounted\n\n")
    assert got.records == 2 and not got.events and got.invalid == 0


def test_reader_skips_the_backlog_and_reads_only_new_records(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text(kmsg(GB10_NO_MEMORY, 1) + "\n")
    reader = ms.KmsgReader(str(path))
    reader.open()                                   # seeks to the end: the old record is history
    assert reader.read_new().records == 0
    with open(path, "a") as fh:
        fh.write(kmsg(GB10_NO_MEMORY, 2) + "\n" + kmsg(KMSG_XID_149, 3)[:20])  # second record cut mid-write
    first = reader.read_new()
    assert first.events == {ms.NV_ERR_NO_MEMORY: 1} and first.invalid == 0
    with open(path, "a") as fh:
        fh.write(kmsg(KMSG_XID_149, 3)[20:] + "\n")
    second = reader.read_new()                      # the rest of the cut record completes it
    assert second.xids == {149: 1} and second.records == 1
    reader.close()


def test_reader_on_a_missing_or_unreadable_path_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        ms.KmsgReader(str(tmp_path / "nope")).open()
    with pytest.raises(IsADirectoryError):
        ms.KmsgReader(str(tmp_path)).open()


def test_reader_bounds_one_round(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("".join(kmsg(GB10_NO_MEMORY, i) + "\n" for i in range(200)))
    reader = ms.KmsgReader(str(path), max_records=1, from_start=True)
    reader.open()
    got = reader.read_new()      # one 8 KiB read at most: part of the file, not all of it
    assert 0 < got.events[ms.NV_ERR_NO_MEMORY] < 200
    rest = reader.read_new()
    assert got.events[ms.NV_ERR_NO_MEMORY] + rest.events[ms.NV_ERR_NO_MEMORY] < 200
    reader.close()


# --- /proc/meminfo ------------------------------------------------------------------------------
def test_meminfo_of_this_test_bed():
    text = (DATA / "meminfo.testbed-x86_64").read_text()
    info = ms.parse_meminfo(text)
    assert info.invalid == 0 and info.complete
    v = info.values
    assert v["MemTotal"] == 24683652 * 1024 and v["MemFree"] == 16223956 * 1024
    assert v["MemAvailable"] == 20906836 * 1024 and v["SwapTotal"] == 0 and v["SwapFree"] == 0
    assert v["HugePages_Total"] == 0  # a unit-less line
    assert info.reclaimable_bytes() == (4668852 + 54452 - 9056 + 288196) * 1024
    assert info.headroom_bytes() == v["MemFree"] + info.reclaimable_bytes()


def test_meminfo_of_a_gb10_before_and_after_filling_the_page_cache():
    before = ms.parse_meminfo((DATA / "meminfo.gb10-baseline").read_text())
    after = ms.parse_meminfo((DATA / "meminfo.gb10-after-60g-write").read_text())
    assert before.complete and after.complete and before.invalid == after.invalid == 0
    total = after.values["MemTotal"]
    assert total / GIB == pytest.approx(121.69, abs=0.01)
    # MemAvailable barely moves while MemFree (what CUDA reports as free on GB10) drops by 60 GiB
    assert abs(before.values["MemAvailable"] - after.values["MemAvailable"]) < 0.5 * GIB
    assert (before.values["MemFree"] - after.values["MemFree"]) / GIB == pytest.approx(61.7, abs=0.1)
    # the page cache explains it: free + reclaimable is what the box can give
    assert after.headroom_bytes() / GIB == pytest.approx(41.52 + 72.64, abs=0.01)


def test_meminfo_malformed_and_truncated_lines_are_counted():
    text = (DATA / "meminfo.testbed-x86_64").read_text()
    cut = text[: text.index("Cached:") + 14]            # ends inside the Cached line
    info = ms.parse_meminfo(cut)
    assert "Cached" not in info.values and info.invalid == 1 and info.complete
    bad = ms.parse_meminfo("MemTotal: 12 kB\nMemFree: lots kB\nnonsense\nShmem: -5 kB\nBuffers: 1 MB\n")
    assert bad.values == {"MemTotal": 12 * 1024} and bad.invalid == 4 and not bad.complete
    assert bad.reclaimable_bytes() is None and bad.headroom_bytes() is None
    assert ms.parse_meminfo("").values == {} and ms.parse_meminfo("").invalid == 0


# --- /proc/pressure/memory ----------------------------------------------------------------------
def test_psi_of_this_test_bed():
    psi = ms.parse_psi((DATA / "pressure_memory.testbed-x86_64").read_text())
    assert psi.invalid == 0
    assert set(psi.ratios) == {(k, w) for k in ms.PSI_KINDS for w in ms.PSI_WINDOWS}
    assert all(0 <= v <= 1 for v in psi.ratios.values()) and set(psi.stall_seconds) == {"some", "full"}


def test_psi_values_and_totals():
    psi = ms.parse_psi("some avg10=12.50 avg60=3.00 avg300=0.75 total=2500000\n"
                       "full avg10=5.00 avg60=1.00 avg300=0.25 total=1000000\n")
    assert psi.ratios[("some", "avg10")] == 0.125 and psi.ratios[("full", "avg60")] == 0.01
    assert psi.stall_seconds == {"some": 2.5, "full": 1.0}


@pytest.mark.parametrize("text,valid_kinds", [
    ("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg6", {"some"}),      # truncated
    ("some avg10=x avg60=0.00 avg300=0.00 total=0\n", set()),                                  # not a number
    ("some avg10=0.00 avg60=0.00 total=0\n", set()),                                           # window missing
    ("half avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", set()),                               # unknown kind
    ("full avg10=150.0 avg60=0.00 avg300=0.00 total=0\n", set()),                              # over 100 %
])
def test_psi_malformed_lines_are_counted(text, valid_kinds):
    psi = ms.parse_psi(text)
    assert psi.invalid == 1 and {k for k, _ in psi.ratios} == valid_kinds


def test_recorded_files_are_what_the_kernel_writes_here():
    """The recorded test-bed files have the same fields as the live files (values differ over time)."""
    live = ms.parse_meminfo(Path("/proc/meminfo").read_text())
    recorded = ms.parse_meminfo((DATA / "meminfo.testbed-x86_64").read_text())
    assert set(ms.MEMINFO_FIELDS) <= set(live.values) and set(ms.MEMINFO_FIELDS) <= set(recorded.values)
    if os.path.exists("/proc/pressure/memory"):
        assert ms.parse_psi(Path("/proc/pressure/memory").read_text()).invalid == 0
