"""`vllm-spark convert-nvfp4`: the ModelOpt NVFP4 layout vLLM loads, exclusions, fused siblings,
the inverse, bounded streaming memory, and clear errors.  Real files, vLLM's own config parser; no
fakes.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vllm_spark_plugin.quant import convert, nvfp4


@pytest.fixture(scope="module")
def converted(tiny_model_path, tmp_path_factory):
    dst = tmp_path_factory.mktemp("conv") / "nvfp4"
    report = convert.convert(tiny_model_path, dst)
    return Path(tiny_model_path), dst, report


def test_layout_matches_modelopt(converted):
    src, dst, report = converted
    t = load_file(str(dst / "model.safetensors"))
    m = "model.layers.0.mlp.experts.3.gate_proj"
    assert t[f"{m}.weight"].dtype == torch.uint8 and t[f"{m}.weight"].shape == (64, 64)
    assert t[f"{m}.weight_scale"].dtype == torch.float8_e4m3fn and t[f"{m}.weight_scale"].shape == (64, 8)
    assert t[f"{m}.weight_scale_2"].dtype == torch.float32 and t[f"{m}.weight_scale_2"].shape == ()
    assert t[f"{m}.input_scale"].dtype == torch.float32 and float(t[f"{m}.input_scale"]) == 1.0
    for kept in ("lm_head.weight", "model.embed_tokens.weight", "model.layers.1.mlp.gate.weight",
                 "model.layers.1.input_layernorm.weight"):
        assert t[kept].dtype == torch.bfloat16 and f"{kept[:-7]}.weight_scale" not in t
    assert report.quantized_modules == 56 and report.copied_tensors == 13
    # the tensors are the format module's output for the source tensor
    w = load_file(str(src / "model.safetensors"))[f"{m}.weight"]
    up = load_file(str(src / "model.safetensors"))["model.layers.0.mlp.experts.3.up_proj.weight"]
    q = nvfp4.quantize_weight(w, torch.maximum(nvfp4.amax(w), nvfp4.amax(up)))
    assert torch.equal(q.weight, t[f"{m}.weight"]) and torch.equal(q.weight_scale_2, t[f"{m}.weight_scale_2"])


def test_fused_siblings_share_the_global_scale(converted):
    _, dst, _ = converted
    t = load_file(str(dst / "model.safetensors"))
    for layer in (0, 1):
        attn = f"model.layers.{layer}.self_attn"
        s = {t[f"{attn}.{p}.weight_scale_2"].item() for p in ("q_proj", "k_proj", "v_proj")}
        assert len(s) == 1
        for e in range(8):
            ex = f"model.layers.{layer}.mlp.experts.{e}"
            assert t[f"{ex}.gate_proj.weight_scale_2"].item() == t[f"{ex}.up_proj.weight_scale_2"].item()


def test_quant_config_is_what_vllm_parses(converted):
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    _, dst, _ = converted
    legacy = json.loads((dst / "hf_quant_config.json").read_text())
    embedded = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert legacy["quantization"]["quant_algo"] == "NVFP4" and legacy["quantization"]["group_size"] == 16
    assert embedded["quant_method"] == "modelopt" and embedded["ignore"] == legacy["quantization"]["exclude_modules"]
    for cfg in (legacy, embedded):
        parsed = ModelOptNvFp4Config.from_config(cfg)
        assert parsed.quant_method == "NVFP4" and parsed.group_size == 16
        assert parsed.is_layer_excluded("lm_head") and parsed.is_layer_excluded("model.layers.1.mlp.gate")
        assert not parsed.is_layer_excluded("model.layers.1.mlp.experts")
        assert not parsed.is_layer_excluded("model.layers.0.self_attn.qkv_proj")
    # vLLM's detection probes the plugin's claim first; on this CPU machine it claims the checkpoint
    from vllm_spark_plugin.hooks import nvfp4_claim
    from vllm.model_executor.layers.quantization import get_quantization_config
    nvfp4_claim.register_nvfp4_quantization()
    claim = get_quantization_config(nvfp4_claim.SPARK_NVFP4)
    assert claim.override_quantization_method(embedded, None) == "spark_nvfp4"
    assert claim.override_quantization_method(embedded, "modelopt_fp4") is None  # the user's choice stands
    assert claim.override_quantization_method({"quant_method": "fp8"}, None) is None


def test_side_files_copied(converted):
    src, dst, _ = converted
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        assert (dst / name).read_bytes() == (src / name).read_bytes()
    assert not (dst / ".complete").exists()


def test_inverse_is_the_reference_dequantisation(converted, tmp_path):
    _, dst, _ = converted
    dq = tmp_path / "dq"
    report = convert.dequantize_checkpoint(dst, dq)
    assert report.dequantized_modules == 56
    q = load_file(str(dst / "model.safetensors"))
    d = load_file(str(dq / "model.safetensors"))
    m = "model.layers.1.self_attn.o_proj"
    assert d[f"{m}.weight"].dtype == torch.bfloat16 and f"{m}.weight_scale" not in d
    assert torch.equal(d[f"{m}.weight"], nvfp4.dequantize(q[f"{m}.weight"], q[f"{m}.weight_scale"],
                                                          q[f"{m}.weight_scale_2"], torch.bfloat16))
    assert "quantization_config" not in json.loads((dq / "config.json").read_text())


def test_exclude_patterns(tiny_model_path, tmp_path):
    dst = tmp_path / "ex"
    report = convert.convert(tiny_model_path, dst, excludes=["model.layers.0.*", *convert.DEFAULT_EXCLUDES])
    assert report.quantized_modules == 28
    assert "model.layers.0.*" in report.exclude_modules
    with safe_open(str(dst / "model.safetensors"), "pt") as fh:
        assert fh.get_tensor("model.layers.0.self_attn.q_proj.weight").dtype == torch.bfloat16
        assert fh.get_tensor("model.layers.1.self_attn.q_proj.weight").dtype == torch.uint8
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config
    parsed = ModelOptNvFp4Config.from_config(json.loads((dst / "config.json").read_text())["quantization_config"])
    assert parsed.is_layer_excluded("model.layers.0.self_attn.o_proj")
    assert not parsed.is_layer_excluded("model.layers.1.self_attn.o_proj")


def test_fused_3d_experts_are_split_per_expert(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    g = torch.Generator().manual_seed(3)
    e, i, h = 4, 32, 64
    gate_up = (torch.randn(e, 2 * i, h, generator=g) * 0.1).to(torch.bfloat16)
    down = (torch.randn(e, h, i, generator=g) * 0.1).to(torch.bfloat16)
    save_file({"model.layers.0.mlp.experts.gate_up_proj": gate_up, "model.layers.0.mlp.experts.down_proj": down},
              str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"hidden_size": h, "moe_intermediate_size": i, "num_experts": e}))
    convert.convert(src, tmp_path / "dst")
    t = load_file(str(tmp_path / "dst" / "model.safetensors"))
    for x in range(e):
        gate, up = gate_up[x, :i], gate_up[x, i:]
        shared = torch.maximum(nvfp4.amax(gate), nvfp4.amax(up))
        assert torch.equal(t[f"model.layers.0.mlp.experts.{x}.up_proj.weight"],
                           nvfp4.quantize_weight(up.contiguous(), shared).weight)
        assert torch.equal(t[f"model.layers.0.mlp.experts.{x}.down_proj.weight"],
                           nvfp4.quantize_weight(down[x].contiguous()).weight)
    assert not any(n.endswith("gate_up_proj") for n in t)


def test_nan_in_source_is_named(tiny_model_path, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for p in Path(tiny_model_path).iterdir():
        if p.is_file():
            (src / p.name).write_bytes(p.read_bytes())
    t = load_file(str(src / "model.safetensors"))
    t["model.layers.1.mlp.experts.2.down_proj.weight"][5, 7] = float("nan")
    save_file(t, str(src / "model.safetensors"))
    with pytest.raises(nvfp4.NvFp4Error, match=r"model\.layers\.1\.mlp\.experts\.2\.down_proj\.weight in "
                                                r"model\.safetensors: 1 non-finite value.*\[5, 7\]"):
        convert.convert(src, tmp_path / "dst")
    out = subprocess.run([sys.executable, "-m", "vllm_spark_plugin.cli", "convert-nvfp4", str(src), str(tmp_path / "d2")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "convert-nvfp4: error:" in out.stderr and "non-finite" in out.stderr
    assert "Traceback" not in out.stderr


def test_refuses_bad_source_and_destination(converted, tiny_model_path, tmp_path):
    _, dst, _ = converted
    with pytest.raises(convert.ConvertError, match="exists and is not empty"):
        convert.convert(tiny_model_path, dst)
    with pytest.raises(convert.ConvertError, match="is not a folder"):
        convert.convert(tmp_path / "nope", tmp_path / "x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(convert.ConvertError, match="has no config.json"):
        convert.convert(tmp_path / "empty", tmp_path / "y")


_SYNTH = """
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
src = Path(sys.argv[1]); src.mkdir(parents=True)
g = torch.Generator().manual_seed(0)
for f in range(4):
    save_file({f"model.layers.{f * 4 + i}.mlp.down_proj.weight": (torch.randn(4096, 4096, generator=g) * 0.02)
               .to(torch.bfloat16) for i in range(4)}, str(src / f"model-{f}.safetensors"))
(src / "config.json").write_text(json.dumps({"architectures": ["X"]}))
"""


def test_streaming_memory_is_bounded(tmp_path):
    """512 MiB of bf16 weights in 4 files, 32 MiB shards: the converter's resident memory grows by
    far less than the checkpoint (a fresh process, so the peak is the converter's)."""
    src = tmp_path / "big"
    subprocess.run([sys.executable, "-c", _SYNTH, str(src)], check=True, timeout=600)
    out = subprocess.run([sys.executable, "-m", "vllm_spark_plugin.cli", "convert-nvfp4", str(src),
                          str(tmp_path / "out"), "--shard-size", "32MB", "--json"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    growth = report["peak_rss_bytes"] - report["baseline_rss_bytes"]
    assert report["bytes_in"] == 512 << 20
    assert growth < 256 << 20, f"grew by {growth / 2**20:.0f} MiB for a 512 MiB checkpoint"
    assert len(report["shards"]) >= 4
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(index["weight_map"]) == 64 and index["metadata"]["total_size"] == report["bytes_out"]
