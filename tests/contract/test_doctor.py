"""`vllm-spark doctor`: each check and its fix, and the real command on this machine.

Fakes only at the device seam (`doctor.Probe`: CUDA presence, capability, which FP4 backends
import: no GPU here) and for /proc/meminfo of a 128 GB Spark (a file written by the test).  The
CLI runs for real in a subprocess against this machine's vLLM.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_spark_plugin import doctor
from vllm_spark_plugin.vllm.capabilities import Capability
from vllm_spark_plugin.quant import memory_guard

GIB = 1 << 30


def spark_meminfo(tmp_path, available_gib: float, total_gib: float = 119.7):
    p = tmp_path / "meminfo"
    p.write_text(f"MemTotal:       {int(total_gib * GIB / 1024)} kB\n"
                 f"MemFree:        {int(available_gib * GIB / 1024) - 1000} kB\n"
                 f"MemAvailable:   {int(available_gib * GIB / 1024)} kB\n")
    return str(p)


def all_on():
    return {n: Capability(n, True, "as expected") for n in ("step_hook", "stat_logger", "nvfp4_config", "moe_policy")}


def gb10_probe(meminfo: str, imports=None, cap=(12, 1)) -> doctor.Probe:
    return doctor.Probe(
        vllm_version=lambda: "0.32.0", in_window=lambda: True, capabilities=all_on, has_cuda=lambda: True,
        device_name=lambda: "NVIDIA GB10", capability=lambda: cap,
        backend_imports=lambda: imports if imports is not None else {
            "marlin": None, "flashinfer_cutlass": None, "b12x": "Python package 'b12x' is not installed",
            "cutlass": None},
        plugin_entry_points=lambda: ["spark"], meminfo_path=meminfo)


def by_name(checks):
    return {c.name: c for c in checks}


def test_healthy_spark_passes(tmp_path):
    serve = doctor.parse_serve_args(["serve", "nvidia/Qwen3-30B-A3B-NVFP4", "--gpu-memory-utilization", "0.6"])
    checks = by_name(doctor.run_checks({}, serve, gb10_probe(spark_meminfo(tmp_path, 110))))
    assert not [c for c in checks.values() if c.status == doctor.FAIL]
    assert checks["device"].status == doctor.OK and "12.1" in checks["device"].detail
    assert checks["fp4_backends"].status == doctor.OK and "b12x: Python package 'b12x'" in checks["fp4_backends"].detail
    assert checks["memory"].status == doctor.OK and "0.60" in checks["memory"].detail
    assert checks["cuda_graphs"].status == doctor.OK


@pytest.mark.parametrize("name,value,fix", [
    ("VLLM_USE_FLASHINFER_MOE_FP4", "1", "--moe-backend flashinfer_cutlass"),
    ("VLLM_USE_FLASHINFER_MOE_FP4", "0", "--moe-backend marlin"),
    ("VLLM_FLASHINFER_MOE_BACKEND", "latency", "--moe-backend flashinfer_trtllm"),
    ("VLLM_FLASHINFER_MOE_BACKEND", "throughput", "--moe-backend flashinfer_cutlass"),
    ("VLLM_NVFP4_GEMM_BACKEND", "marlin", "--linear-backend marlin"),
    ("VLLM_NVFP4_GEMM_BACKEND", "flashinfer-cutlass", "--linear-backend flashinfer_cutlass"),
])
def test_stale_env_vars_fail_with_their_replacement(tmp_path, name, value, fix):
    checks = by_name(doctor.run_checks({name: value}, doctor.ServeArgs(gpu_memory_utilization=0.5),
                                       gb10_probe(spark_meminfo(tmp_path, 110))))
    c = checks[f"env:{name}"]
    assert c.status == doctor.FAIL and "no longer reads" in c.detail
    assert fix in c.fix and f"unset {name}" in c.fix


def test_default_memory_utilisation_fails_on_a_busy_spark(tmp_path):
    meminfo = spark_meminfo(tmp_path, 80)  # 40 GB already used by other processes
    c = by_name(doctor.run_checks({}, doctor.ServeArgs(), gb10_probe(meminfo)))["memory"]
    assert c.status == doctor.FAIL and "vLLM's default" in c.detail
    adv = memory_guard.advise_from_system(None, 0.9, meminfo)
    assert f"--gpu-memory-utilization {adv.safe_utilization:.2f}" in c.fix
    assert 0.55 < adv.safe_utilization < 0.65  # (80 - 6) / 119.7


def test_model_that_does_not_fit(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    with open(model / "model.safetensors", "wb") as fh:
        fh.truncate(30 * GIB)  # sparse file: 30 GiB of weights
    c = by_name(doctor.run_checks({}, doctor.ServeArgs(model=str(model), gpu_memory_utilization=0.2),
                                  gb10_probe(spark_meminfo(tmp_path, 20))))["memory"]
    assert c.status == doctor.FAIL and "the model needs about" in c.detail
    assert "smaller model" in c.fix


def test_eager_mode_warns_on_cuda_and_does_not_apply_on_cpu(tmp_path):
    serve = doctor.parse_serve_args(["--", "serve", "m", "--enforce-eager", "--gpu-memory-utilization=0.5"])
    assert serve.enforce_eager and serve.gpu_memory_utilization == 0.5 and serve.model == "m"
    c = by_name(doctor.run_checks({}, serve, gb10_probe(spark_meminfo(tmp_path, 110))))["cuda_graphs"]
    assert c.status == doctor.WARN and "drop --enforce-eager" in c.fix
    cpu = gb10_probe(spark_meminfo(tmp_path, 110))
    cpu.has_cuda = lambda: False
    assert by_name(doctor.run_checks({}, serve, cpu))["cuda_graphs"].status == doctor.NA


def test_devices_and_backends(tmp_path):
    meminfo = spark_meminfo(tmp_path, 110)
    none = {n: "ImportError: libcuda" for n in ("marlin", "flashinfer_cutlass", "b12x", "cutlass")}
    checks = by_name(doctor.run_checks({}, doctor.ServeArgs(gpu_memory_utilization=0.5), gb10_probe(meminfo, none)))
    assert checks["fp4_backends"].status == doctor.FAIL
    h100 = by_name(doctor.run_checks({}, doctor.ServeArgs(gpu_memory_utilization=0.5),
                                     gb10_probe(meminfo, cap=(9, 0))))
    assert h100["device"].status == doctor.WARN and "--quantization spark_nvfp4" in h100["device"].detail


def test_vllm_version_plugin_allow_list_and_settings(tmp_path):
    probe = gb10_probe(spark_meminfo(tmp_path, 110))
    probe.vllm_version, probe.in_window = (lambda: "0.25.1"), (lambda: False)
    probe.capabilities = lambda: {**all_on(), "step_hook": Capability("step_hook", False, "SchedulerOutput lacks x")}
    checks = by_name(doctor.run_checks({"VLLM_PLUGINS": "other", "SPARK_PLUGIN_MOE_BACKEND": "triton",
                                        "VLLM_TUNED_CONFIG_FOLDER": str(tmp_path / "nope")},
                                       doctor.ServeArgs(gpu_memory_utilization=0.5), probe))
    assert checks["vllm"].status == doctor.WARN and "0.25.1 is outside the checked release window" in checks["vllm"].detail
    from vllm_spark_plugin.vllm.releases import vllm_requirement
    assert f"pip install '{vllm_requirement()}'" in checks["vllm"].fix  # the window's, from releases.py
    off = checks["feature:step_hook"]
    assert off.status == doctor.FAIL and "SchedulerOutput lacks x" in off.detail and "step duration" in off.detail
    assert checks["feature:stat_logger"].status == doctor.OK
    assert checks["plugin"].status == doctor.FAIL and "add spark to VLLM_PLUGINS" in checks["plugin"].fix
    assert checks["moe_setting"].status == doctor.FAIL and "marlin" in checks["moe_setting"].detail
    assert checks["tuned_configs"].status == doctor.FAIL


def test_memory_guard_formula():
    adv = memory_guard.advise(total=128 * GIB, available=100 * GIB, model_bytes=20 * GIB, configured=0.9)
    assert adv.reserve_bytes == int(0.05 * 128 * GIB)
    assert adv.safe_utilization == 0.73  # floor((100 - 6.4) / 128, 2)
    assert not adv.ok and adv.fits and "above the safe 0.73" in adv.message
    assert adv.min_utilization == 0.18  # ceil((20 * 1.05 + 2) / 128, 2)
    assert memory_guard.advise(128 * GIB, 100 * GIB, configured=0.7).ok
    small = memory_guard.advise(total=24 * GIB, available=10 * GIB)
    assert small.reserve_bytes == 4 * GIB and small.safe_utilization == 0.25


def test_read_meminfo_on_this_machine():
    info = memory_guard.read_meminfo()
    assert info["MemTotal"] > info["MemAvailable"] > 0


def _cli(*args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k not in doctor.STALE_ENV and not k.startswith("SPARK_PLUGIN_")}
    env.pop("VLLM_TUNED_CONFIG_FOLDER", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "vllm_spark_plugin.cli", "doctor", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_cli_on_this_machine():
    """Real run here (vLLM 0.32 CPU build, no GPU): passes with a device warning; a stale variable
    makes it fail with the replacement printed."""
    out = _cli("--json")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] and checks["vllm"]["status"] == "ok" and checks["device"]["status"] == "warn"
    assert checks["memory"]["status"] == "info"
    bad = _cli("--", "serve", "m", "--enforce-eager", env_extra={"VLLM_USE_FLASHINFER_MOE_FP4": "1"})
    assert bad.returncode == 1
    assert "[FAIL] env:VLLM_USE_FLASHINFER_MOE_FP4" in bad.stdout
    assert "fix: unset VLLM_USE_FLASHINFER_MOE_FP4; pass --moe-backend flashinfer_cutlass" in bad.stdout


def test_doctor_reads_the_settings_file_the_server_reads(tmp_path):
    """SPARK_PLUGIN_CONFIG counts for doctor as for the server: a backend named only in the file is
    checked, and a bad SLO there is one failing line naming the key."""
    cfg = tmp_path / "spark.json"
    cfg.write_text('{"moe_backend": "not-a-backend", "floors": "-5"}')
    checks = {c.name: c for c in doctor.run_checks({"SPARK_PLUGIN_CONFIG": str(cfg)})}
    assert checks["moe_setting"].status == doctor.FAIL and "not-a-backend" in checks["moe_setting"].detail
    assert checks["settings"].status == doctor.FAIL and "SPARK_PLUGIN_FLOORS='-5'" in checks["settings"].detail
    ok = {c.name: c for c in doctor.run_checks({})}
    assert ok["settings"].status == doctor.OK and "moe_setting" not in ok
