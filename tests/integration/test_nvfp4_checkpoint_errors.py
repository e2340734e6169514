"""Malformed NVFP4 checkpoints fail start-up with an error naming the tensor and the file.

Each defect is written into a real checkpoint (the tiny model converted with the plugin's
converter, then one tensor or the config edited) and checked through the validation function;
one defect (a NaN scale) also goes through a real `vllm serve` start-up, whose failure must carry
the same message in its log tail.  No fakes.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_spark_plugin.quant import checkpoint, convert
from vllm_spark_plugin.testbed.server import ServerStartError, VllmServer

EXPERT = "model.layers.1.mlp.experts.3.up_proj"
QPROJ = "model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def good_nvfp4(tiny_model_path, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("ckpt") / "nvfp4"
    convert.convert(tiny_model_path, dst)
    return dst


def _variant(good: Path, tmp_path: Path, edit) -> Path:
    dst = tmp_path / "bad"
    shutil.copytree(good, dst)
    shard = dst / "model.safetensors"
    tensors = load_file(str(shard))
    edit(tensors, dst)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return dst


def _missing(t, _):
    del t[f"{EXPERT}.weight_scale"]


def _shape(t, _):
    t[f"{QPROJ}.weight_scale"] = t[f"{QPROJ}.weight_scale"][:, :-1].contiguous()


def _nan(t, _):
    t[f"{EXPERT}.weight_scale_2"] = torch.tensor(float("nan"))


def _nan_block(t, _):
    raw = t[f"{QPROJ}.weight_scale"].view(torch.uint8).clone()
    raw[3, 1] = 0x7F  # an E4M3 NaN
    t[f"{QPROJ}.weight_scale"] = raw.view(torch.float8_e4m3fn)


def _inf(t, _):
    t[f"{QPROJ}.input_scale"] = torch.tensor(float("inf"))


def _zero(t, _):
    t[f"{EXPERT}.weight_scale_2"] = torch.tensor(0.0)


def _group32(t, folder):
    # scales for 32-element groups on every module, and the config saying so
    for name in [n for n in t if n.endswith(".weight_scale")]:
        t[name] = t[name][:, ::2].contiguous()
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32
    (folder / "config.json").write_text(json.dumps(cfg))
    hq = json.loads((folder / "hf_quant_config.json").read_text())
    hq["quantization"]["group_size"] = 32
    (folder / "hf_quant_config.json").write_text(json.dumps(hq))


CASES = [
    (_missing, rf"missing tensor {EXPERT}\.weight_scale \(module {EXPERT} has {EXPERT}\.weight in model\.safetensors\)"),
    (_shape, rf"shape mismatch: {QPROJ}\.weight_scale in model\.safetensors is \[256, 7\], but {QPROJ}\.weight \[256, 64\] needs \[256, 8\]"),
    (_nan, rf"NaN scale: {EXPERT}\.weight_scale_2 in model\.safetensors"),
    (_nan_block, rf"NaN scale: {QPROJ}\.weight_scale in model\.safetensors at block \[3, 1\]"),
    (_inf, rf"inf scale: {QPROJ}\.input_scale in model\.safetensors"),
    (_zero, rf"zero scale: {EXPERT}\.weight_scale_2 in model\.safetensors"),
    (_group32, r"group size 32: model\.layers\.0\.mlp\.experts\.0\.down_proj\.weight_scale in model\.safetensors is \[128, 2\]"),
]


def test_converted_checkpoint_is_valid(good_nvfp4):
    report = checkpoint.validate(good_nvfp4)
    assert report.ok and report.quant_algo == "NVFP4" and report.group_size == 16
    assert report.modules == 56  # 2 layers x (q, k, v, o + 8 experts x 3)


@pytest.mark.parametrize("edit,pattern", CASES, ids=[c[0].__name__.strip("_") for c in CASES])
def test_each_defect_is_named(good_nvfp4, tmp_path, edit, pattern):
    bad = _variant(good_nvfp4, tmp_path, edit)
    with pytest.raises(checkpoint.CheckpointError, match=pattern) as info:
        checkpoint.validate(bad)
    assert str(bad) in str(info.value)


def test_group_size_32_is_also_reported_from_the_config(good_nvfp4, tmp_path):
    bad = _variant(good_nvfp4, tmp_path, _group32)
    msg = checkpoint.validate_checkpoint(bad).message()
    assert "config.json quantization_config: config_groups.group_0.weights.group_size is 32" in msg
    assert "hf_quant_config.json quantization: group_size is 32" in msg


def test_validate_at_load_raises_once_and_caches_success(good_nvfp4, tmp_path):
    checkpoint.validate_at_load(str(good_nvfp4))
    checkpoint.validate_at_load(str(good_nvfp4))  # cached: no second scan
    bad = _variant(good_nvfp4, tmp_path, _nan)
    with pytest.raises(checkpoint.CheckpointError, match="NaN scale"):
        checkpoint.validate_at_load(str(bad))
    checkpoint.validate_at_load("org/some-hub-model")  # not local: left to vLLM's loader


def test_whole_expert_missing_is_found_through_the_expert_count(good_nvfp4, tmp_path):
    def drop_expert(t, _):
        for name in [n for n in t if n.startswith("model.layers.0.mlp.experts.5.")]:
            del t[name]

    bad = _variant(good_nvfp4, tmp_path, drop_expert)
    msg = checkpoint.validate_checkpoint(bad).message()
    for leaf in ("gate_proj", "up_proj", "down_proj"):
        assert f"missing tensor model.layers.0.mlp.experts.5.{leaf}.weight" in msg


@pytest.mark.server
def test_vllm_serve_fails_at_startup_with_the_message(good_nvfp4, artifacts_dir):
    bad = artifacts_dir / "tiny-nvfp4-nan-scale"
    if bad.exists():
        shutil.rmtree(bad)
    shutil.copytree(good_nvfp4, bad)
    shard = bad / "model.safetensors"
    tensors = load_file(str(shard))
    _nan(tensors, bad)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    server = VllmServer(model_path=str(bad), log_path=artifacts_dir / "vllm-server-nvfp4-nan.log")
    with pytest.raises(ServerStartError) as info:
        server.start(timeout=600)
    server.stop()
    assert f"NaN scale: {EXPERT}.weight_scale_2 in model.safetensors" in str(info.value)
    assert "is malformed" in str(info.value)
