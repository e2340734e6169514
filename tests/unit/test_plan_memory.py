"""Memory arithmetic of the capacity planner against hand-computed cases (no GPU needed)."""
from __future__ import annotations

import pytest

from vllm_spark_plugin.plan.arch import count_params, load_model, parse_config
from vllm_spark_plugin.plan.deployment import GiB, Deployment, PlanError
from vllm_spark_plugin.plan.formats import component_formats
from vllm_spark_plugin.plan.hardware import from_dict, load_hardware
from vllm_spark_plugin.plan.memory import plan_memory


def dep_for(model, fmt="bf16", kv="bf16", context=4096, tp=1, pp=1, hw="gb10", **kw):
    arch = load_model(model)[0] if isinstance(model, str) else model
    h = load_hardware(hw)
    return Deployment(arch=arch, hw=h, weight_format=fmt, formats=component_formats(fmt), kv_dtype=kv,
                      state_dtype=kw.pop("state", arch.state_dtype), context=context, tp=tp, pp=pp,
                      os_reserve_bytes=h.os_reserve_bytes, **kw)


def test_dense_llama_kv_bytes_per_token():
    # Llama-3.1-8B: 32 layers x 2 (K and V) x 8 KV heads x 128 head_dim x 2 bytes (bf16)
    #             = 32 * 2 * 8 * 128 * 2 = 131072 bytes per token
    assert dep_for("Llama-3.1-8B").kv_bytes_per_token() == 131072


def test_fp8_kv_halves_the_cache():
    # same model, fp8 KV: 1 byte per element -> 131072 / 2 = 65536 bytes per token
    assert dep_for("Llama-3.1-8B", kv="fp8").kv_bytes_per_token() == 65536
    # a stream at 4096 tokens (a multiple of vLLM's 16-token block): 65536 * 4096 = 268435456 bytes
    assert dep_for("Llama-3.1-8B", kv="fp8").stream_cache_bytes(4096) == {"full": 268435456}


def test_dense_llama_parameters_and_weight_bytes():
    p = count_params(load_model("Llama-3.1-8B")[0])
    # attention per layer: q 4096*4096 + k,v 2*4096*(8*128) + o 4096*4096 = 41943040; x32 = 1342177280
    assert p.attention == 1342177280
    # MLP per layer: 3 * 4096 * 14336 = 176160768; x32 = 5637144576
    assert p.dense_mlp == 5637144576
    # embeddings and untied lm_head: 128256 * 4096 = 525336576 each
    assert p.embeddings == p.lm_head == 525336576
    d = dep_for("Llama-3.1-8B", fmt="nvfp4")
    w = d.weight_bytes()
    # nvfp4 = 4.5 bits/weight: 5637144576 * 4.5 / 8 = 3170893824 bytes; lm_head stays bf16: 2 bytes each
    assert w["dense_mlp"] == pytest.approx(3170893824)
    assert w["lm_head"] == 525336576 * 2


def test_moe_qwen3_30b_params_and_kv():
    d = dep_for("Qwen3-30B-A3B")
    p = d.params
    # one expert: 3 * 2048 * 768 = 4718592; 128 experts x 48 layers = 28991029248 routed params
    assert p.per_expert == 4718592
    assert p.routed_experts == 4718592 * 128 * 48 == 28991029248
    # router: 2048 * 128 per layer x 48 = 12582912
    assert p.router == 12582912
    # KV: 48 layers x 2 x 4 KV heads x 128 x 2 bytes = 98304 bytes per token
    assert d.kv_bytes_per_token() == 98304
    # active per token: attention 48*(2048*4096*2 + 2*2048*512) = 905969664
    #   + 8 of 128 experts: 48 * 8 * 4718592 = 1811939328 + router 12582912 + lm_head 151936*2048 = 311164928
    assert d.active_params() == 905969664 + 1811939328 + 12582912 + 311164928


def test_mla_deepseek_v3_style_latent_cache():
    cfg = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
           "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
           "qk_nope_head_dim": 128, "v_head_dim": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
           "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3,
           "vocab_size": 129280}
    arch = parse_config(cfg, name="deepseek-v3-style")
    assert arch.count(mixer="mla") == 61 and arch.count(ffn="dense") == 3 and arch.count(ffn="moe") == 58
    d = dep_for(arch)
    # per token: 61 layers x (kv_lora_rank 512 + rope 64) x 2 bytes = 61 * 576 * 2 = 70272 bytes
    assert d.kv_bytes_per_token() == 70272
    # fp8: 61 * 576 * 1 = 35136 bytes; the latent is not split by tp (replicated on every rank)
    assert dep_for(arch, kv="fp8").kv_bytes_per_token() == 35136
    assert dep_for(arch, kv="fp8", tp=2).kv_bytes_per_token() == 35136


def test_hybrid_linear_attention_state_and_kv():
    d = dep_for("Qwen3.6-35B-A3B", kv="bf16")
    # only the 10 full-attention layers cache K/V: 10 x 2 x 2 KV heads x 256 x 2 bytes = 20480 bytes/token
    assert d.kv_bytes_per_token() == 20480
    # Gated DeltaNet state per layer: 32 value heads x 128 x 128 x 4 bytes (fp32, the config's mamba_ssm_dtype)
    #   = 2097152, + conv state (2*16*128 + 32*128 = 8192 channels) x (kernel 4 - 1) x 2 bytes = 49152
    #   -> 2146304 per layer x 30 layers = 64389120 bytes per stream, whatever the context
    per = d.stream_cache_bytes(4096)
    assert per["linear"] == 30 * (32 * 128 * 128 * 4 + 8192 * 3 * 2) == 64389120
    assert per["full"] == 20480 * 4096
    assert d.stream_cache_bytes(16)["linear"] == per["linear"]
    # a decode step reads and writes the state back: 2 x 64389120
    assert d.state_rw_bytes() == 2 * 64389120


def test_sliding_window_layers_are_capped():
    d = dep_for("gpt-oss-20b", kv="bf16")
    per_layer = 2 * 8 * 64 * 2  # 2 x 8 KV heads x 64 x 2 bytes = 2048 bytes per token per layer
    per = d.stream_cache_bytes(4096)
    # 12 full layers hold all 4096 tokens: 12 * 2048 * 4096
    assert per["full"] == 12 * per_layer * 4096
    # 12 sliding layers hold the 128-token window rounded to blocks plus one block: 144 tokens
    assert per["sliding"] == 12 * per_layer * 144
    # the decode read touches the window only: 12 * 2048 * 128 for the sliding layers
    assert d.kv_read_bytes(4096) == 12 * per_layer * 4096 + 12 * per_layer * 128


def test_tensor_parallel_splits_weights_and_kv_heads():
    one, two = dep_for("Llama-3.1-8B"), dep_for("Llama-3.1-8B", tp=2)
    assert two.kv_bytes_per_token() == one.kv_bytes_per_token() / 2
    assert two.weight_bytes_per_node()["dense_mlp"] == one.weight_bytes_per_node()["dense_mlp"] / 2
    # tp=3 divides neither the 8 KV heads nor the 32 attention heads (nor they it): rejected
    with pytest.raises(PlanError):
        dep_for("Llama-3.1-8B", tp=3)


def test_memory_plan_arithmetic_by_hand():
    # a custom 100 GB box with a 10 GB OS reserve and 0.8 utilization: usable = min(80, 90) = 80 GB
    hw = from_dict({"name": "box", "memory_bytes": 100e9, "bandwidth_nominal_bytes_per_second": 1e11,
                    "compute_flops_per_second": {"bf16": 1e14}, "os_reserve_bytes": 10e9,
                    "gpu_memory_utilization": 0.8, "runtime_base_bytes": 1e9, "unified_memory": True})
    arch = load_model("Llama-3.1-8B")[0]
    d = Deployment(arch=arch, hw=hw, weight_format="bf16", formats=component_formats("bf16"), kv_dtype="bf16",
                   context=8192, os_reserve_bytes=10e9, gpu_memory_utilization=0.8, cudagraph_bytes=1e9,
                   max_num_batched_tokens=2048, max_num_seqs=64)
    m = plan_memory(d)
    assert m.usable_bytes == pytest.approx(80e9)
    # bf16 weights: 8030261248 params (+ norms) x 2 bytes
    assert m.weights_total == pytest.approx(2 * d.params.total)
    # activations: 2048 tokens x 2 bytes x (12*4096 + 3*2*14336) + 2 x 64 seqs x 128256 x 4 bytes
    act = 2048 * 2 * (12 * 4096 + 3 * 2 * 14336) + 2 * 64 * 128256 * 4
    assert m.runtime["activations"] == pytest.approx(act)
    budget = 80e9 - m.weights_total - (1e9 + 1e9 + act)
    assert m.cache_budget_bytes == pytest.approx(budget)
    # per stream: 131072 bytes x 8192 tokens = 1073741824; streams = floor(budget / that)
    assert m.per_stream_total == 131072 * 8192
    assert m.max_streams == int(budget // (131072 * 8192))
    assert any("max concurrent streams" in s for s in m.steps)


def test_model_that_does_not_fit():
    # Llama-3.3-70B in bf16 is ~141 GB of weights: more than a Spark's 128 GB
    m = plan_memory(dep_for("Llama-3.3-70B", fmt="bf16"))
    assert not m.fits and m.max_streams == 0
    assert "DOES NOT FIT" in m.steps[-1]
    # nvfp4 (~41 GB incl. bf16 embeddings/lm_head) fits
    assert plan_memory(dep_for("Llama-3.3-70B", fmt="nvfp4")).fits


def test_pipeline_parallel_halves_layers_per_node():
    one, two = dep_for("Llama-3.3-70B", fmt="bf16"), dep_for("Llama-3.3-70B", fmt="bf16", pp=2)
    assert two.kv_bytes_per_token() == one.kv_bytes_per_token() / 2
    w1, w2 = one.weight_bytes_per_node(), two.weight_bytes_per_node()
    assert w2["dense_mlp"] == w1["dense_mlp"] / 2
    # embeddings on stage 0, lm_head on the last: a node holds one of them (same size here)
    assert w2["embeddings"] + w2["lm_head"] == pytest.approx(w1["lm_head"])
    assert plan_memory(dep_for("Llama-3.3-70B", fmt="bf16", pp=2)).fits


def test_os_reserve_and_utilization_bound_usable_memory():
    d = dep_for("Llama-3.1-8B", gpu_memory_utilization=0.95)
    # 0.95 x 128 GB = 121.6 GB but 128 GB - 8 GiB = 119.41 GB: the OS reserve binds
    assert plan_memory(d).usable_bytes == pytest.approx(128e9 - 8 * GiB)
