"""Tuned Triton fused-MoE configs: merging into VLLM_TUNED_CONFIG_FOLDER (user first) and the
`tune-moe` sweep.  The sweep's GPU timing is replaced by a fake `bench(config, m)` at the kernel
seam (no GPU here); the command's no-GPU exit, the shape reading and the file naming run for real.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_spark_plugin.vllm import kernels
from vllm_spark_plugin.moe import tune, tuned_configs

NAME = "E=8,N=64,device_name=NVIDIA_GB10.json"


def _write(folder: Path, name: str, payload: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(json.dumps(payload))
    return p


def test_nothing_to_add_leaves_the_environment_alone(tmp_path):
    env = {}
    assert tuned_configs.apply(env, sources=[tmp_path / "none", tmp_path / "empty"]) is None
    assert env == {}
    env = {"VLLM_TUNED_CONFIG_FOLDER": str(tmp_path)}
    assert tuned_configs.apply(env, sources=[tmp_path / "none"]) == str(tmp_path)


def test_single_source_is_used_directly(tmp_path):
    tuned = tmp_path / "tuned"
    _write(tuned, NAME, {"1": {"BLOCK_SIZE_M": 16}})
    env = {}
    assert tuned_configs.apply(env, sources=[tuned]) == str(tuned)
    assert env["VLLM_TUNED_CONFIG_FOLDER"] == str(tuned)


def test_user_folder_first_then_plugin_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    user = tmp_path / "user"
    _write(user, NAME, {"1": {"from": "user"}})
    _write(user, "NVIDIA_GB10_SHRINK.json", {"lora": True})  # other kernels' configs stay visible
    tuned = tmp_path / "tuned"
    _write(tuned, NAME, {"1": {"from": "tune-moe"}})
    _write(tuned, "E=128,N=768,device_name=NVIDIA_GB10.json", {"1": {"from": "tune-moe"}})
    env = {"VLLM_TUNED_CONFIG_FOLDER": str(user)}
    merged = Path(tuned_configs.apply(env, sources=[tuned]))
    assert env["VLLM_TUNED_CONFIG_FOLDER"] == str(merged) and merged != user
    assert json.loads((merged / NAME).read_text()) == {"1": {"from": "user"}}  # the user's file wins
    assert json.loads((merged / "E=128,N=768,device_name=NVIDIA_GB10.json").read_text())["1"]["from"] == "tune-moe"
    assert (merged / "NVIDIA_GB10_SHRINK.json").exists()
    # a child process inherits the merged folder and keeps it
    assert tuned_configs.apply(env, sources=[tuned]) == str(merged)


def test_vllm_reads_the_merged_folder(tmp_path, monkeypatch):
    """vLLM's own lookup (get_moe_configs) finds the plugin's file through the variable."""
    from vllm.model_executor.layers.fused_moe import fused_moe

    name = kernels.fused_moe_config_file_name(8, 64, None)
    tuned = tmp_path / "tuned"
    _write(tuned, name, {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                               "num_warps": 4, "num_stages": 2}, "triton_version": "3.5.0"})
    env: dict = {}
    tuned_configs.apply(env, sources=[tuned])
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", env["VLLM_TUNED_CONFIG_FOLDER"])
    fused_moe.get_moe_configs.cache_clear()
    try:
        configs = fused_moe.get_moe_configs(8, 64, None)
    finally:
        fused_moe.get_moe_configs.cache_clear()
    assert configs == {1: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                           "num_warps": 4, "num_stages": 2}}


def test_packaged_folder_ships_no_unsourced_configs():
    assert tuned_configs.PACKAGED_DIR.is_dir()
    assert tuned_configs.config_files(tuned_configs.PACKAGED_DIR) == []
    assert "no config files" in (tuned_configs.PACKAGED_DIR / "README.txt").read_text()


# ---- tune-moe --------------------------------------------------------------------------------------
def test_search_space_fits_gb10_shared_memory():
    for dtype, nbytes in ((None, 2), ("fp8_w8a8", 1)):
        space = tune.search_space(dtype)
        assert space and all(tune.smem_bytes(c, nbytes) <= tune.GB10_SMEM_BYTES for c in space)
        assert any(c["BLOCK_SIZE_N"] == 256 for c in tune.search_space("fp8_w8a8"))
    assert len(tune.search_space(None, quick=True)) < len(tune.search_space(None))


def test_tune_picks_the_fastest_config_per_batch_and_skips_failures():
    space = tune.search_space(None, quick=True)

    def fake_bench(cfg, m):  # the GPU timing seam
        if cfg["BLOCK_SIZE_M"] == 64 and m == 1:
            raise RuntimeError("out of resources")
        return abs(cfg["BLOCK_SIZE_M"] - m) + cfg["num_stages"] * 0.01

    best = tune.tune([1, 64], space, fake_bench)
    assert best[1]["BLOCK_SIZE_M"] == 16 and best[1]["num_stages"] == 2
    assert best[64]["BLOCK_SIZE_M"] == 64
    with pytest.raises(tune.TuneError, match="no config ran for batch size 8"):
        tune.tune([8], space, lambda c, m: 1 / 0)


def test_shape_from_model(tiny_model_path, tmp_path):
    s = tune.shape_from_model(tiny_model_path)
    assert (s.experts, s.hidden, s.intermediate, s.topk, s.dtype) == (8, 128, 64, 2, None)
    assert tune.shape_from_model(tiny_model_path, tp=2).intermediate == 32
    cfg = json.loads((Path(tiny_model_path) / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(tune.TuneError, match="NVFP4 model"):
        tune.shape_from_model(tmp_path)
    assert tune.shape_from_model(tmp_path, dtype="bf16").dtype is None


def test_write_configs_uses_vllms_file_name(tmp_path):
    name = kernels.fused_moe_config_file_name(8, 64, "fp8_w8a8")
    assert name.startswith("E=8,N=64,device_name=") and name.endswith(",dtype=fp8_w8a8.json")
    p = tune.write_configs(tmp_path, name, {2: {"BLOCK_SIZE_M": 16}, 1: {"BLOCK_SIZE_M": 32}}, "3.5.0")
    data = json.loads(p.read_text())
    assert list(data) == ["1", "2", "triton_version"]


def test_cli_exits_2_without_a_gpu(tiny_model_path):
    out = subprocess.run([sys.executable, "-m", "vllm_spark_plugin.cli", "tune-moe", "--model", str(tiny_model_path),
                          "--quick"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "no CUDA GPU here" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "vllm_spark_plugin.cli", "tune-moe", "--shape", "8,128,63,2",
                          "--tp", "2"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "not divisible by --tp 2" in bad.stderr
