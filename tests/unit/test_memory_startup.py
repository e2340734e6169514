"""The start-up snapshot: what vLLM's start-up check compares on unified memory, and the fix it needs.

Inputs: the GB10 /proc/meminfo states recorded in tests/unit/data/memory_sources (unsloth#10704's
measurements: 60 GB written to disk moved MemFree, and CUDA's free memory with it, by 61.7 GiB while
MemAvailable stayed at 115.7 GiB).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from vllm_spark_plugin.quant import memory_guard as mg

DATA = Path(__file__).resolve().parent / "data" / "memory_sources"
GIB = 1 << 30


def meminfo(name: str) -> dict[str, int]:
    return mg.read_meminfo(DATA / name)


def test_page_cache_makes_vllms_check_fail_and_the_fix_is_dropping_caches():
    snap = mg.startup_snapshot(meminfo("meminfo.gb10-after-60g-write"), 0.7)
    assert snap.requested_bytes / GIB == pytest.approx(0.7 * 121.69, abs=0.01)
    assert snap.mem_free_bytes / GIB == pytest.approx(41.52, abs=0.01)
    assert not snap.vllm_check_passes and not snap.ok
    assert "start-up will fail" in snap.message and "MemFree 41.5 GiB" in snap.message
    assert "drop_caches" in snap.fix and "--gpu-memory-utilization" not in snap.fix  # 0.7 fits beside the OS


def test_same_box_with_a_cold_page_cache_passes():
    snap = mg.startup_snapshot(meminfo("meminfo.gb10-baseline"), 0.7)
    assert snap.vllm_check_passes and snap.ok and snap.fix == ""
    assert "passes" in snap.message


def test_vllms_default_utilisation_needs_both_fixes():
    snap = mg.startup_snapshot(meminfo("meminfo.gb10-after-60g-write"), 0.92)
    assert snap.safe_utilization == 0.90  # floor((115.65 - 6.08) / 121.69, 2)
    assert not snap.ok and "drop_caches" in snap.fix and "--gpu-memory-utilization 0.90" in snap.fix


def test_passing_check_that_starves_the_os_is_a_warning():
    info = meminfo("meminfo.gb10-baseline")  # MemFree 103.25 GiB
    snap = mg.startup_snapshot(info, 0.84)    # 102.2 GiB requested, MemFree 103.25 GiB: passes
    assert snap.vllm_check_passes
    assert snap.ok == (0.84 <= snap.safe_utilization)
    tight = mg.startup_snapshot({**info, "MemAvailable": 100 * GIB}, 0.84)
    assert tight.vllm_check_passes and not tight.ok and "under its reserve" in tight.message
    assert "--gpu-memory-utilization 0.77" in tight.fix  # floor((100 - 6.08) / 121.69, 2)


def test_nothing_to_reclaim_means_lower_utilisation():
    info = {"MemTotal": 128 * GIB, "MemFree": 20 * GIB, "MemAvailable": 21 * GIB, "Cached": GIB}
    snap = mg.startup_snapshot(info, 0.5)
    assert not snap.vllm_check_passes and "drop_caches" not in snap.fix
    assert "--gpu-memory-utilization 0.11" in snap.fix  # floor((21 - 6.4) / 128, 2)


def test_log_startup_snapshot_reads_the_file(tmp_path, caplog):
    snap = mg.log_startup_snapshot(0.7, meminfo_path=DATA / "meminfo.gb10-after-60g-write")
    assert snap is not None and not snap.ok
    assert any("Fix: drop the page cache" in r.getMessage() for r in caplog.records)
    (tmp_path / "m").write_text("MemTotal: 10 kB\n")
    assert mg.log_startup_snapshot(0.7, meminfo_path=tmp_path / "m") is None
    assert mg.log_startup_snapshot(None) is None
