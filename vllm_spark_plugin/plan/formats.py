"""Storage formats: bits per weight, bytes per cached element, and which components a format covers.

Bits per weight include the block scales the format carries:
* nvfp4: 4-bit E2M1 values + one FP8 (E4M3) scale per 16 values = 4 + 8/16 = 4.5 bits; the one FP32
  global scale per tensor is negligible;
* mxfp4: 4-bit E2M1 + one E8M0 scale per 32 values = 4 + 8/32 = 4.25 bits;
* fp8: 8 bits; per-tensor / per-channel / 128x128-block scales add < 0.1 % and are ignored;
* q8_0 (llama.cpp GGUF): 8-bit values + one FP16 scale per 32 = 8.5 bits;
* int4 (GPTQ/AWQ-style W4A16, group 128, BF16 scale): 4 + 16/128 = 4.125 bits.
"""
from __future__ import annotations

WEIGHT_FORMAT_BITS: dict[str, float] = {
    "bf16": 16.0,
    "fp16": 16.0,
    "fp8": 8.0,
    "nvfp4": 4.5,
    "mxfp4": 4.25,
    "int4": 4.125,
    "q8_0": 8.5,
}

# KV-cache element sizes (bytes) and recurrent-state element sizes.
KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1}
STATE_DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}

# Components whose weights a weight format applies to.  Everything else stays BF16, as in ModelOpt
# NVFP4/FP8 checkpoints: embeddings, lm_head, router gates, norms and the small mixer parameters
# (conv1d, A_log, dt_bias, D).
QUANTIZABLE = ("attention", "linear_attention", "dense_mlp", "shared_experts", "routed_experts",
               "moe_latent")
ALWAYS_BF16 = ("router", "embeddings", "lm_head", "small", "extra")
COMPONENTS = QUANTIZABLE + ALWAYS_BF16

# quant scope -> the components the chosen weight format covers
SCOPES: dict[str, tuple[str, ...]] = {
    "linear": QUANTIZABLE,            # ModelOpt / llm-compressor default: every linear layer in blocks
    "experts": ("routed_experts",),   # e.g. gpt-oss's native MXFP4: only the routed experts
}

# the weight format's natural compute dtype for GEMMs (looked up in the hardware profile; falls back
# to bf16 when the profile has no peak for it, as W4A16 kernels such as Marlin do)
COMPUTE_DTYPE: dict[str, str] = {
    "bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "nvfp4": "nvfp4", "mxfp4": "mxfp4",
    "int4": "bf16", "q8_0": "bf16",
}


def bits(fmt: str) -> float:
    try:
        return WEIGHT_FORMAT_BITS[fmt]
    except KeyError:
        raise ValueError(f"unknown weight format {fmt!r}; choose from {', '.join(WEIGHT_FORMAT_BITS)}") from None


def default_scope(fmt: str) -> str:
    return "experts" if fmt == "mxfp4" else "linear"


def component_formats(weight_format: str, scope: str | None = None,
                      overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The storage format of every component for one weight format (+ scope, + per-component overrides)."""
    bits(weight_format)
    scope = scope or default_scope(weight_format)
    if scope not in SCOPES:
        raise ValueError(f"unknown quant scope {scope!r}; choose from {', '.join(SCOPES)}")
    out = {c: (weight_format if c in SCOPES[scope] else "bf16") for c in COMPONENTS}
    for comp, fmt in (overrides or {}).items():
        if comp not in out:
            raise ValueError(f"unknown component {comp!r} in a component format; choose from {', '.join(COMPONENTS)}")
        bits(fmt)
        out[comp] = fmt
    return out
