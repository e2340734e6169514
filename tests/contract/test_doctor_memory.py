"""`vllm-spark doctor`'s unified-memory and ignored-setting checks (vllm_spark_plugin/doctor/memory.py).

Each seeded misconfiguration goes in through a seam doctor already has: `Probe.meminfo_path` (the
recorded GB10 /proc/meminfo states), `Probe.extra["kernel_log_path"]` (a file in /dev/kmsg format with
published GB10 driver lines), the environment mapping, and the serve arguments.  vLLM's registry of
variables is the real one (`vllm.envs`).  The CLI runs for real with `--json`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from vllm_spark_plugin import doctor
from vllm_spark_plugin.doctor import memory as doctor_memory

DATA = Path(__file__).resolve().parents[1] / "unit" / "data" / "memory_sources"
GB10_NO_MEMORY = ("NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) "
                  "returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359")  # vllm#56824 (GB10)
XID_31 = ("NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr 00000000. MMU Fault: "
          "ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE")  # akash#244


def probe(tmp_path, meminfo="meminfo.gb10-baseline", kernel_lines=()):
    log = tmp_path / "kmsg"
    log.write_text("".join(f"3,{i},{i * 1000},-;{line}\n" for i, line in enumerate(kernel_lines, 1)))
    return types.SimpleNamespace(meminfo_path=str(DATA / meminfo), extra={"kernel_log_path": str(log)})


def run(tmp_path, argv=(), env=None, cuda=True, **kw):
    serve = doctor.parse_serve_args(["serve", "m", *argv])
    return {c.name: c for c in doctor_memory.checks(env or {}, serve, probe(tmp_path, **kw), cuda)}


def test_clean_spark_passes_every_check(tmp_path):
    checks = run(tmp_path, ["--gpu-memory-utilization", "0.7", "--max-num-seqs", "64"])
    assert {c.status for c in checks.values()} == {doctor.OK}, [(c.name, c.detail) for c in checks.values()]
    assert set(checks) == {"memory_headroom", "memory_startup", "driver_events", "unknown_env", "cudagraph_sizes"}


def test_page_cache_fails_vllms_start_up_check_and_the_fix_is_drop_caches(tmp_path):
    c = run(tmp_path, ["--gpu-memory-utilization", "0.7"], meminfo="meminfo.gb10-after-60g-write")["memory_startup"]
    assert c.status == doctor.FAIL and "MemFree 41.5 GiB" in c.detail and "drop_caches" in c.fix


def test_utilisation_above_what_fits_beside_the_os(tmp_path):
    c = run(tmp_path, ["--gpu-memory-utilization", "0.93"])["memory_startup"]   # MemFree 103.25 of 121.69 GiB
    assert c.status == doctor.FAIL and "--gpu-memory-utilization 0.90" in c.fix
    # vLLM's default 0.9 asks 109.5 GiB: more than MemFree even at rest; the page cache covers the gap
    default = run(tmp_path)["memory_startup"]
    assert default.status == doctor.FAIL and "requested 0.90" in default.detail and "drop_caches" in default.fix


def test_low_reclaimable_headroom(tmp_path):
    low = tmp_path / "meminfo"
    low.write_text("MemTotal: 127601213 kB\nMemFree: 4000000 kB\nMemAvailable: 9000000 kB\n"
                   "Cached: 6000000 kB\nShmem: 2000000 kB\n")
    checks = {c.name: c for c in doctor_memory.checks({}, doctor.ServeArgs(gpu_memory_utilization=0.5),
                                                      types.SimpleNamespace(meminfo_path=str(low), extra={
                                                          "kernel_log_path": str(tmp_path / "none")}), True)}
    assert checks["memory_headroom"].status == doctor.FAIL and "6%" in checks["memory_headroom"].detail
    assert checks["driver_events"].status == doctor.INFO and "sudo dmesg" in checks["driver_events"].fix


def test_driver_out_of_memory_and_xid_lines_are_reported(tmp_path):
    c = run(tmp_path, ["--gpu-memory-utilization", "0.7"], kernel_lines=[GB10_NO_MEMORY, GB10_NO_MEMORY, XID_31])
    ev = c["driver_events"]
    assert ev.status == doctor.WARN and "2 NV_ERR_NO_MEMORY" in ev.detail and "Xid 31 x1" in ev.detail
    assert "VllmSparkDriverOutOfMemory" in ev.fix


def test_env_vars_the_installed_vllm_does_not_know(tmp_path):
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ATTENTON_BACKEND": "FLASHINFER",   # typo
           "VLLM_USE_FLASHINFER_MOE_FP4": "1"}                                     # stale: its own check
    checks = run(tmp_path, ["--gpu-memory-utilization", "0.7"], env=env)
    typo = checks["env:VLLM_ATTENTON_BACKEND"]
    assert typo.status == doctor.WARN and "silently ignored" in typo.detail
    assert "unset VLLM_ATTENTON_BACKEND" in typo.fix
    assert "env:VLLM_CPU_KVCACHE_SPACE" not in checks and "env:VLLM_USE_FLASHINFER_MOE_FP4" not in checks
    import vllm.envs
    assert "VLLM_CPU_KVCACHE_SPACE" in vllm.envs.environment_variables  # the registry doctor reads


@pytest.mark.parametrize("argv,covered", [
    (["--max-num-seqs", "64", "-cc.cudagraph_capture_sizes=[1,2,4,8,16,32]"], False),
    (["--max-num-seqs", "64", "--compilation-config", '{"max_cudagraph_capture_size": 64}'], True),
    (["--max-num-seqs=1024"], False),                        # vLLM's default sizes stop at 512
    (["--max-num-seqs", "256"], True),
])
def test_capture_sizes_against_max_num_seqs(tmp_path, argv, covered):
    c = run(tmp_path, ["--gpu-memory-utilization", "0.7", *argv])["cudagraph_sizes"]
    assert c.status == (doctor.OK if covered else doctor.WARN), c.detail
    if not covered:
        assert "run without CUDA graphs" in c.detail and "max_cudagraph_capture_size=" in c.fix


def test_not_applicable_on_the_cpu(tmp_path):
    checks = run(tmp_path, cuda=False)
    assert checks["memory_startup"].status == checks["cudagraph_sizes"].status == getattr(doctor, "NA", doctor.INFO)


def test_doctor_json_on_this_machine_lists_the_checks():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "SPARK_PLUGIN_"))}
    env["VLLM_NOT_A_REAL_SETTING"] = "1"
    out = subprocess.run([sys.executable, "-m", "vllm_spark_plugin.cli", "doctor", "--json"],
                         capture_output=True, text=True, env=env, timeout=600)
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["memory_headroom"]["status"] == "ok"      # this machine has plenty free
    # /dev/kmsg is readable here (root): the whole buffer is read; user-space records never count
    assert checks["driver_events"]["status"] == ("ok" if os.access("/dev/kmsg", os.R_OK) else "info")
    assert checks["env:VLLM_NOT_A_REAL_SETTING"]["status"] == "warn"
    assert out.returncode == (0 if report["ok"] else 1)
