"""What is being planned: model + hardware + formats + workload + parallelism, and the per-node sizes
that follow from them (bytes of each weight component, KV bytes per token, recurrent state per stream).

Per-node rules: tensor parallelism (tp) splits every block weight, the vocabulary-parallel embeddings
and lm_head, KV heads (never below one head per rank) and linear-attention / Mamba heads; router
gates, norms and MLA's compressed latent cache are replicated.  Pipeline parallelism (pp) splits the
layers evenly; the embeddings live on the first stage and lm_head on the last, so a node holds the
larger of the two.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from vllm_spark_plugin.plan.arch import ModelArch, Params, active_params, count_params
from vllm_spark_plugin.plan.engine import Serving
from vllm_spark_plugin.plan.formats import (COMPUTE_DTYPE, KV_DTYPE_BYTES, STATE_DTYPE_BYTES, bits,
                                            component_formats)
from vllm_spark_plugin.plan.hardware import Hardware
from vllm_spark_plugin.plan.routing import skew_from_routing_doc

GB = 1e9
GiB = 2**30
BF16 = 2  # bytes of an activation / conv-state element


class PlanError(ValueError):
    """Bad planner input (reported to the user with exit status 2)."""


@dataclass
class Deployment:
    arch: ModelArch
    hw: Hardware
    weight_format: str = "nvfp4"
    formats: dict = field(default_factory=dict)  # component -> storage format
    kv_dtype: str = "bf16"
    state_dtype: str = "bf16"
    compute_dtype: str = "bf16"
    context: int = 4096
    prompt_tokens: int = 1024
    tp: int = 1
    pp: int = 1
    dp: int = 1
    gpu_memory_utilization: float = 0.85
    os_reserve_bytes: float = 0.0
    cudagraph_bytes: float = 1 * GiB
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    text_only: bool = False
    serving: Serving = field(default_factory=Serving)
    model_routing: dict = field(default_factory=dict)  # the model file's published routing statistic
    params: Params = field(default=None)  # type: ignore[assignment]

    def __post_init__(self):
        if self.params is None:
            self.params = count_params(self.arch)
        if not self.formats:
            self.formats = component_formats(self.weight_format)
        for name in ("context", "prompt_tokens", "tp", "pp", "dp", "max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise PlanError(f"{name} must be a positive integer, got {v!r}")
        if self.kv_dtype not in KV_DTYPE_BYTES:
            raise PlanError(f"unknown KV dtype {self.kv_dtype!r}; choose from {', '.join(KV_DTYPE_BYTES)}")
        if self.state_dtype not in STATE_DTYPE_BYTES:
            raise PlanError(f"unknown state dtype {self.state_dtype!r}; choose from {', '.join(STATE_DTYPE_BYTES)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise PlanError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.pp > self.arch.n_layers:
            raise PlanError(f"pp={self.pp} exceeds the model's {self.arch.n_layers} layers")
        try:
            self.serving.validate(self.tp)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        a = self.arch
        for heads, what in ((a.n_kv_heads, "KV heads"), (a.n_heads, "attention heads"),
                            (a.lin_v_heads, "linear-attention value heads"), (a.mamba_heads, "Mamba heads")):
            if heads and self.tp > 1 and heads % self.tp and self.tp % heads:
                raise PlanError(f"tp={self.tp} does not divide the {heads} {what} (nor they it)")

    # ------------------------------------------------------------ sizes

    @property
    def sparks(self) -> int:
        return self.tp * self.pp * self.dp

    def bytes_per_param(self, component: str) -> float:
        return bits(self.formats[component]) / 8

    def weight_bytes(self) -> dict:
        """Whole-model bytes by component (all ranks together)."""
        p = self.params.as_dict()
        if self.text_only:
            p["extra"] = 0.0
        return {c: n * self.bytes_per_param(c) for c, n in p.items()}

    def weight_bytes_per_node(self) -> dict:
        wb = self.weight_bytes()
        out = {}
        for c, b in wb.items():
            if c in ("router", "small"):
                out[c] = b / self.pp
            elif c in ("embeddings", "lm_head"):
                out[c] = b / self.tp
            elif c == "extra":
                out[c] = b  # a vision encoder is replicated on every rank in vLLM
            else:
                out[c] = b / (self.tp * self.pp)
        if self.pp > 1:  # first stage holds the embeddings, last holds lm_head: size for the larger
            big = max(out["embeddings"], out["lm_head"])
            out["embeddings"], out["lm_head"] = (big, 0.0) if out["embeddings"] >= out["lm_head"] else (0.0, big)
        return out

    def kv_heads_per_rank(self) -> float:
        return max(1.0, self.arch.n_kv_heads / self.tp)

    def kv_bytes_per_token_layer(self, mixer: str) -> float:
        """Cached bytes one token adds to one attention layer of one rank."""
        a, e = self.arch, KV_DTYPE_BYTES[self.kv_dtype]
        if mixer in ("full", "sliding"):
            return 2 * self.kv_heads_per_rank() * a.head_dim * e
        if mixer == "mla":  # compressed latent + decoupled RoPE key, replicated across tp
            return (a.kv_lora_rank + a.qk_rope_head_dim) * e
        return 0.0

    def state_bytes_layer(self, mixer: str) -> float:
        """Fixed per-stream recurrent state of one linear-attention / Mamba layer of one rank."""
        a, s = self.arch, STATE_DTYPE_BYTES[self.state_dtype]
        if mixer == "linear":
            heads = a.lin_v_heads / self.tp
            conv_dim = (2 * a.lin_k_heads * a.lin_k_dim + a.lin_v_heads * a.lin_v_dim) / self.tp
            return heads * a.lin_k_dim * a.lin_v_dim * s + conv_dim * (a.lin_conv_kernel - 1) * BF16
        if mixer == "mamba":
            heads = a.mamba_heads / self.tp
            conv_dim = (a.mamba_heads * a.mamba_head_dim + 2 * a.mamba_groups * a.mamba_state) / self.tp
            return heads * a.mamba_head_dim * a.mamba_state * s + conv_dim * (a.mamba_conv_kernel - 1) * BF16
        return 0.0

    def layer_counts(self) -> dict:
        """Mixer-kind -> layer count of one node (pp splits layers evenly)."""
        out: dict = {}
        for l in self.arch.layers:
            if l.mixer:
                out[l.mixer] = out.get(l.mixer, 0) + 1
        return {k: v / self.pp for k, v in out.items()}

    def kv_bytes_per_token(self) -> float:
        """Per node, all attention layers, one token (sliding layers included, before their cap)."""
        return sum(n * self.kv_bytes_per_token_layer(m) for m, n in self.layer_counts().items())

    def stream_cache_bytes(self, context: int) -> dict:
        """Per node bytes one stream holds at `context` tokens, by kind (vLLM's 16-token blocks)."""
        ctx = math.ceil(context / 16) * 16
        out = {}
        for m, n in self.layer_counts().items():
            if m in ("full", "mla"):
                out[m] = n * self.kv_bytes_per_token_layer(m) * ctx
            elif m == "sliding":
                window = min(ctx, math.ceil((self.arch.sliding_window or ctx) / 16) * 16 + 16)
                out[m] = n * self.kv_bytes_per_token_layer(m) * window
            else:
                out[m] = n * self.state_bytes_layer(m)
        return out

    def kv_read_bytes(self, context: int) -> float:
        """Per node bytes of cache one decode step reads for one stream at `context` tokens."""
        out = 0.0
        for m, n in self.layer_counts().items():
            if m in ("full", "mla"):
                out += n * self.kv_bytes_per_token_layer(m) * context
            elif m == "sliding":
                out += n * self.kv_bytes_per_token_layer(m) * min(context, self.arch.sliding_window or context)
        return out

    def state_rw_bytes(self) -> float:
        """Per node recurrent-state bytes a decode step reads and writes back for one stream."""
        return 2 * sum(n * self.state_bytes_layer(m) for m, n in self.layer_counts().items())

    def active_params(self) -> float:
        return active_params(self.arch, self.params)

    def attention_flops_per_token(self, context: int) -> float:
        """Per token, whole model (before tp): attention math that is not a weight GEMM."""
        a = self.arch
        f = 0.0
        for l in a.layers:
            if l.mixer == "full":
                f += 4 * a.n_heads * a.head_dim * context
            elif l.mixer == "sliding":
                f += 4 * a.n_heads * a.head_dim * min(context, a.sliding_window or context)
            elif l.mixer == "mla":
                f += 4 * a.n_heads * (a.kv_lora_rank + a.qk_rope_head_dim) * context
            elif l.mixer == "linear":
                f += 6 * a.lin_v_heads * a.lin_k_dim * a.lin_v_dim
            elif l.mixer == "mamba":
                f += 6 * a.mamba_heads * a.mamba_head_dim * a.mamba_state
        return f

    def routing_skew(self) -> tuple[float, str]:
        """(skew, where it came from): the serving option if set, else the model's published statistic."""
        if self.serving.routing_skew is not None:
            return self.serving.routing_skew, "set by hand"
        if not self.arch.is_moe:
            return 0.0, "dense model"
        try:
            return skew_from_routing_doc(self.model_routing, self.arch.n_experts, self.arch.top_k)
        except ValueError as exc:
            raise PlanError(f"model routing statistic: {exc}") from None

    def allreduces_per_step(self) -> int:
        """Two per decoder layer (after attention and after the MLP); one per Nemotron-style sublayer."""
        return sum((1 if l.mixer else 0) + (1 if l.ffn else 0) for l in self.arch.layers)

    def kernels_per_step(self) -> float:
        """Approximate GPU kernels one decode step launches (whole model, one rank)."""
        k = {"full": 8, "sliding": 8, "mla": 10, "linear": 8, "mamba": 6}
        n = 8.0  # embedding, final norm, lm_head, sampling
        for l in self.arch.layers:
            if l.mixer:
                n += k[l.mixer] + (1 if (l.mixer in ("full", "sliding") and self.arch.attn_output_gate) else 0)
            if l.ffn == "dense":
                n += 4
            elif l.ffn == "moe":
                n += 8 + (4 if self.arch.shared_intermediate else 0) + (2 if self.arch.moe_latent else 0)
        return n

    def peak(self) -> tuple[str, float]:
        return self.hw.peak(self.compute_dtype)

    def inputs(self) -> dict:
        skew, skew_source = self.routing_skew()
        return {
            "model": self.arch.name, "hardware": self.hw.name, "weight_format": self.weight_format,
            "component_formats": dict(self.formats), "kv_dtype": self.kv_dtype, "state_dtype": self.state_dtype,
            "compute_dtype": self.peak()[0], "context_tokens": self.context, "prompt_tokens": self.prompt_tokens,
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "sparks": self.sparks,
            "gpu_memory_utilization": self.gpu_memory_utilization, "os_reserve_bytes": self.os_reserve_bytes,
            "cudagraph_bytes": self.cudagraph_bytes, "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs, "text_only": self.text_only,
            "serving": self.serving.to_dict(), "routing_skew": skew, "routing_skew_source": skew_source,
        }


def default_compute_dtype(weight_format: str) -> str:
    return COMPUTE_DTYPE.get(weight_format, "bf16")


__all__ = ["Deployment", "PlanError", "GB", "GiB", "default_compute_dtype"]
