"""Memory fit: weights + runtime reserve + per-stream cache against the usable memory of one node,
giving the maximum number of concurrent streams at the context length, with every step written out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from vllm_spark_plugin.plan.deployment import GB, Deployment
from vllm_spark_plugin.plan.formats import KV_DTYPE_BYTES, STATE_DTYPE_BYTES, bits

_LABEL = {"attention": "attention", "linear_attention": "linear-attention/Mamba projections",
          "dense_mlp": "dense MLP", "shared_experts": "shared experts", "routed_experts": "routed experts",
          "moe_latent": "LatentMoE projections", "router": "router gates", "embeddings": "embeddings",
          "lm_head": "lm_head", "small": "norms & small mixer params", "extra": "vision encoder (memory only)"}


def gb(x: float) -> str:
    return f"{x / GB:.3f} GB"


@dataclass
class MemoryPlan:
    memory_bytes: float
    usable_bytes: float
    weights_bytes: dict
    runtime: dict
    cache_budget_bytes: float
    per_stream_bytes: dict
    max_streams: int
    context: int
    fits: bool
    steps: list = field(default_factory=list)

    @property
    def weights_total(self) -> float:
        return sum(self.weights_bytes.values())

    @property
    def per_stream_total(self) -> float:
        return sum(self.per_stream_bytes.values())

    def to_dict(self) -> dict:
        return {
            "memory_bytes": self.memory_bytes, "usable_bytes": self.usable_bytes,
            "weights_bytes": dict(self.weights_bytes), "weights_total_bytes": self.weights_total,
            "runtime_reserve_bytes": dict(self.runtime), "runtime_reserve_total_bytes": sum(self.runtime.values()),
            "cache_budget_bytes": self.cache_budget_bytes, "context_tokens": self.context,
            "per_stream_bytes": dict(self.per_stream_bytes), "per_stream_total_bytes": self.per_stream_total,
            "max_concurrent_streams": self.max_streams, "fits": self.fits, "steps": list(self.steps),
        }


def activation_bytes(dep: Deployment) -> float:
    """Peak activations of vLLM's profiling forward pass (max_num_batched_tokens tokens) + sampler logits.

    ~12 hidden-sized BF16 buffers per token (residual, norm output, attention in/out, q/k/v ...) plus
    3 buffers of the widest FFN (gate, up, activation; for MoE: top_k x expert width), split by tp,
    plus float32 logits for two max_num_seqs x vocab buffers.
    """
    a = dep.arch
    widths = [0]
    if any(l.ffn == "dense" for l in a.layers):
        widths.append(2 * a.intermediate)
    if a.is_moe:
        widths.append(2 * a.top_k * a.moe_intermediate)
        widths.append(2 * a.shared_intermediate)
    per_token = 2 * (12 * a.hidden + 3 * max(widths) / dep.tp)
    logits = 2 * dep.max_num_seqs * a.vocab * 4 / dep.tp
    return dep.max_num_batched_tokens * per_token + logits


def plan_memory(dep: Deployment) -> MemoryPlan:
    hw = dep.hw
    steps: list[str] = []
    total = hw.memory_bytes
    by_util = dep.gpu_memory_utilization * total
    by_os = total - dep.os_reserve_bytes
    usable = min(by_util, by_os)
    steps.append(
        f"usable memory = min(gpu_memory_utilization x memory, memory - OS reserve) = "
        f"min({dep.gpu_memory_utilization:g} x {gb(total)}, {gb(total)} - {gb(dep.os_reserve_bytes)}) = {gb(usable)}"
        + (" (unified memory: the OS and the GPU share the pool)" if hw.unified_memory else ""))

    w = dep.weight_bytes_per_node()
    split = []
    if dep.tp > 1:
        split.append(f"/ tp {dep.tp}")
    if dep.pp > 1:
        split.append(f"/ pp {dep.pp}")
    for comp, b in w.items():
        n = dep.params.as_dict()[comp]
        if n == 0 or b == 0:
            continue
        fmt = dep.formats[comp]
        steps.append(f"weights: {_LABEL[comp]} {n / 1e9:.3f}B params x {bits(fmt):g} bits ({fmt}) / 8"
                     + (f" {' '.join(split)}" if split and comp not in ('extra',) else "") + f" = {gb(b)}")
    wt = sum(w.values())
    steps.append(f"weights total per node = {gb(wt)}")

    act = activation_bytes(dep)
    runtime = {"base": hw.runtime_base_bytes, "cuda_graphs": dep.cudagraph_bytes, "activations": act}
    steps.append(f"runtime reserve = CUDA context/torch/NCCL {gb(hw.runtime_base_bytes)} + CUDA graphs "
                 f"{gb(dep.cudagraph_bytes)} + activations of a {dep.max_num_batched_tokens}-token profiling "
                 f"pass and sampler logits {gb(act)} = {gb(sum(runtime.values()))}")
    budget = usable - wt - sum(runtime.values())
    steps.append(f"KV/state budget = usable - weights - runtime = {gb(usable)} - {gb(wt)} - "
                 f"{gb(sum(runtime.values()))} = {gb(budget)}")

    per = dep.stream_cache_bytes(dep.context)
    counts = dep.layer_counts()
    kv_e = KV_DTYPE_BYTES[dep.kv_dtype]
    st_e = STATE_DTYPE_BYTES[dep.state_dtype]
    a = dep.arch
    ctx16 = math.ceil(dep.context / 16) * 16
    for m, b in per.items():
        n = counts[m]
        if m == "full":
            steps.append(f"per stream, full attention: {n:g} layers x 2 (K,V) x {dep.kv_heads_per_rank():g} KV heads x "
                         f"{a.head_dim} head_dim x {kv_e} B ({dep.kv_dtype}) x {ctx16} tokens = {gb(b)}")
        elif m == "sliding":
            win = b / (n * dep.kv_bytes_per_token_layer(m))
            steps.append(f"per stream, sliding-window attention: {n:g} layers x 2 x {dep.kv_heads_per_rank():g} x "
                         f"{a.head_dim} x {kv_e} B x min(context, window {a.sliding_window} + one block) = {win:.0f} tokens = {gb(b)}")
        elif m == "mla":
            steps.append(f"per stream, MLA latent cache: {n:g} layers x (kv_lora_rank {a.kv_lora_rank} + rope "
                         f"{a.qk_rope_head_dim}) x {kv_e} B x {ctx16} tokens = {gb(b)}")
        elif m == "linear":
            steps.append(f"per stream, linear-attention state (fixed, any context): {n:g} layers x "
                         f"({a.lin_v_heads / dep.tp:g} heads x {a.lin_k_dim} x {a.lin_v_dim} x {st_e} B ({dep.state_dtype}) "
                         f"+ conv state) = {gb(b)}")
        elif m == "mamba":
            steps.append(f"per stream, Mamba-2 state (fixed, any context): {n:g} layers x ({a.mamba_heads / dep.tp:g} "
                         f"heads x {a.mamba_head_dim} x {a.mamba_state} x {st_e} B ({dep.state_dtype}) + conv state) = {gb(b)}")
    per_total = sum(per.values())
    steps.append(f"per stream total at {dep.context} tokens = {gb(per_total)}")
    if per_total <= 0:
        max_streams = 0 if budget <= 0 else dep.max_num_seqs
    else:
        max_streams = max(0, int(budget // per_total))
    fits = budget > 0 and max_streams >= 1
    if fits:
        steps.append(f"max concurrent streams = floor(budget / per stream) = floor({gb(budget)} / {gb(per_total)}) = {max_streams}"
                     + (f" (vLLM schedules at most max_num_seqs = {dep.max_num_seqs})" if max_streams > dep.max_num_seqs else ""))
    else:
        steps.append("DOES NOT FIT: the weights and runtime reserve leave no room for one stream at this context")
    return MemoryPlan(memory_bytes=total, usable_bytes=usable, weights_bytes=w, runtime=runtime,
                      cache_budget_bytes=budget, per_stream_bytes=per, max_streams=max_streams,
                      context=dep.context, fits=fits, steps=steps)
