"""Model architecture facts from a Hugging Face `config.json`, and parameter counts by component.

One parser serves both a user's config.json and the packaged model files under `plan/models/` (which
hold the published config fields plus their sources), so the packaged numbers go through the same
code path as a real checkpoint.

Supported layouts (detected from the fields present, not only `model_type`): dense GQA transformers
(Llama, Qwen2/3, Mistral), MoE (Qwen3-MoE, Mixtral, gpt-oss, DeepSeek-V2/V3 with MLA), hybrid
linear-attention models (Qwen3-Next / Qwen3.5 / Qwen3.6: Gated DeltaNet + full attention, optionally
nested under `text_config`), sliding/full alternation (`layer_types`, gpt-oss), and Nemotron-H
hybrids (Mamba-2 / attention / MLP / (Latent)MoE layers from `hybrid_override_pattern` or
`layers_block_type`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

MIXERS = ("full", "sliding", "linear", "mamba", "mla")


class ConfigError(ValueError):
    """A config that cannot be read or does not describe a supported decoder."""


@dataclass(frozen=True)
class Layer:
    mixer: str | None  # one of MIXERS, or None (an FFN-only layer, as in Nemotron-H)
    ffn: str | None    # "dense" | "moe" | None (a mixer-only layer)


@dataclass
class ModelArch:
    name: str
    model_type: str
    hidden: int
    vocab: int
    layers: tuple[Layer, ...]
    n_heads: int = 0
    n_kv_heads: int = 0
    head_dim: int = 0
    attn_output_gate: bool = False
    sliding_window: int | None = None
    # MLA (DeepSeek-V2/V3 style)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Gated DeltaNet linear attention
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_k_dim: int = 0
    lin_v_dim: int = 0
    lin_conv_kernel: int = 4
    # Mamba-2
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state: int = 0
    mamba_groups: int = 1
    mamba_conv_kernel: int = 4
    state_dtype: str = "bf16"  # recurrent state dtype vLLM keeps (config's mamba_ssm_dtype / _cache_dtype)
    # MLP / MoE
    intermediate: int = 0
    gated_mlp: bool = True
    n_experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    moe_latent: int = 0
    shared_intermediate: int = 0  # total width of the shared expert(s) of one MoE layer
    shared_gate: bool = False     # Qwen-style sigmoid gate on the shared expert
    tie_embeddings: bool = False
    max_position: int | None = None
    extra_params: dict = field(default_factory=dict)  # memory-only parts (e.g. a vision encoder)
    notes: list = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def count(self, mixer: str | None = None, ffn: str | None = None) -> int:
        return sum(1 for l in self.layers if (mixer is None or l.mixer == mixer) and (ffn is None or l.ffn == ffn))

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0 and self.count(ffn="moe") > 0


def _get(cfg: dict, *keys, default=None):
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return default


def _int(cfg: dict, *keys, default=None, required=False) -> int | None:
    v = _get(cfg, *keys, default=default)
    if v is None:
        if required:
            raise ConfigError(f"config has none of {', '.join(keys)}")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ConfigError(f"config field {keys[0]!r} must be a non-negative number, got {v!r}")
    return int(v)


def _dtype_name(v) -> str | None:
    if v is None:
        return None
    s = str(v).lower().replace("torch.", "")
    return {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16",
            "float16": "fp16", "fp16": "fp16"}.get(s)


_NEMOTRON_KIND = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _nemotron_layers(kinds: list[str]) -> tuple[Layer, ...]:
    out = []
    for k in kinds:
        if k == "mamba":
            out.append(Layer("mamba", None))
        elif k == "attention":
            out.append(Layer("full", None))
        elif k == "mlp":
            out.append(Layer(None, "dense"))
        elif k == "moe":
            out.append(Layer(None, "moe"))
        else:
            raise ConfigError(f"unknown Nemotron-H layer kind {k!r}")
    return tuple(out)


def parse_config(config: dict, name: str = "") -> ModelArch:
    """Build a ModelArch from a Hugging Face config dict (top level or nested `text_config`)."""
    if not isinstance(config, dict):
        raise ConfigError("config must be a JSON object")
    cfg = dict(config)
    if isinstance(config.get("text_config"), dict):  # multimodal wrappers (Qwen3.5/3.6 ...)
        cfg.update(config["text_config"])
    model_type = str(cfg.get("model_type") or "")
    hidden = _int(cfg, "hidden_size", "d_model", "n_embd", required=True)
    vocab = _int(cfg, "vocab_size", required=True)
    if not hidden or not vocab:
        raise ConfigError("hidden_size and vocab_size must be positive")
    n_heads = _int(cfg, "num_attention_heads", "n_head", default=0)
    n_kv = _int(cfg, "num_key_value_heads", "n_head_kv", default=n_heads)
    head_dim = _int(cfg, "head_dim", default=(hidden // n_heads if n_heads else 0))
    n_experts = _int(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0) or 0
    top_k = _int(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk", default=0) or 0
    intermediate = _int(cfg, "intermediate_size", "ffn_hidden_size", default=0) or 0
    moe_inter = _int(cfg, "moe_intermediate_size", default=None)
    if moe_inter is None and n_experts:
        moe_inter = intermediate  # Mixtral / gpt-oss: experts use intermediate_size
    act = str(_get(cfg, "mlp_hidden_act", "hidden_act", default="silu")).lower()
    gated = act not in ("relu2", "gelu", "gelu_new", "relu") or model_type == "gpt_oss"
    if model_type == "nemotron_h":
        gated = False  # squared-ReLU MLPs: up + down only
    # shared experts
    shared_inter = 0
    shared_gate = False
    if cfg.get("shared_expert_intermediate_size"):
        shared_inter = int(cfg["shared_expert_intermediate_size"])
        shared_gate = True
    elif cfg.get("moe_shared_expert_intermediate_size"):
        shared_inter = int(cfg["moe_shared_expert_intermediate_size"]) * max(1, int(cfg.get("n_shared_experts") or 1))
    elif cfg.get("n_shared_experts") and moe_inter:
        shared_inter = int(cfg["n_shared_experts"]) * int(moe_inter)

    state_dtype = _dtype_name(_get(cfg, "mamba_ssm_dtype", "mamba_ssm_cache_dtype")) or "bf16"
    kv_lora = _int(cfg, "kv_lora_rank", default=0) or 0

    # ---- layer list
    layers: tuple[Layer, ...]
    pattern = cfg.get("hybrid_override_pattern")
    block_types = cfg.get("layers_block_type")
    composition = cfg.get("layer_composition")  # planner-only key for packaged files (counts, no order)
    if isinstance(block_types, list) and block_types:
        layers = _nemotron_layers([str(k) for k in block_types])
    elif isinstance(pattern, str) and pattern:
        try:
            layers = _nemotron_layers([_NEMOTRON_KIND[ch] for ch in pattern])
        except KeyError as exc:
            raise ConfigError(f"unknown character {exc.args[0]!r} in hybrid_override_pattern") from None
    elif isinstance(composition, dict):
        kinds: list[str] = []
        for kind, n in composition.items():
            kinds += [str(kind)] * int(n)
        layers = _nemotron_layers(kinds)
    else:
        n = _int(cfg, "num_hidden_layers", "n_layer", "num_layers", required=True)
        if not n:
            raise ConfigError("num_hidden_layers must be positive")
        lt = cfg.get("layer_types")
        mixers: list[str]
        if isinstance(lt, list) and len(lt) == n:
            mp = {"full_attention": "full", "attention": "full", "sliding_attention": "sliding",
                  "linear_attention": "linear", "mamba": "mamba"}
            try:
                mixers = [mp[str(t)] for t in lt]
            except KeyError as exc:
                raise ConfigError(f"unknown layer type {exc.args[0]!r} in layer_types") from None
        elif cfg.get("full_attention_interval") and cfg.get("linear_num_value_heads"):
            k = int(cfg["full_attention_interval"])
            mixers = ["full" if (i % k) == k - 1 else "linear" for i in range(n)]
        elif kv_lora:
            mixers = ["mla"] * n
        else:
            mixers = ["full"] * n
        if kv_lora:
            mixers = ["mla" if m == "full" else m for m in mixers]
        ffns: list[str] = []
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        step = int(cfg.get("decoder_sparse_step") or 1)
        for i in range(n):
            moe = bool(n_experts) and i not in mlp_only and i >= first_dense and ((i + 1) % step == 0)
            ffns.append("moe" if moe else "dense")
        layers = tuple(Layer(m, f) for m, f in zip(mixers, ffns))

    arch = ModelArch(
        name=name or str(cfg.get("_name_or_path") or model_type or "model"),
        model_type=model_type, hidden=hidden, vocab=vocab, layers=layers,
        n_heads=n_heads or 0, n_kv_heads=n_kv or 0, head_dim=head_dim or 0,
        attn_output_gate=bool(cfg.get("attn_output_gate", False)),
        sliding_window=_int(cfg, "sliding_window", default=None),
        q_lora_rank=_int(cfg, "q_lora_rank", default=None),
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", default=0) or 0,
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", default=0) or 0,
        v_head_dim=_int(cfg, "v_head_dim", default=0) or 0,
        lin_k_heads=_int(cfg, "linear_num_key_heads", default=0) or 0,
        lin_v_heads=_int(cfg, "linear_num_value_heads", default=0) or 0,
        lin_k_dim=_int(cfg, "linear_key_head_dim", default=0) or 0,
        lin_v_dim=_int(cfg, "linear_value_head_dim", default=0) or 0,
        lin_conv_kernel=_int(cfg, "linear_conv_kernel_dim", default=4) or 4,
        mamba_heads=_int(cfg, "mamba_num_heads", default=0) or 0,
        mamba_head_dim=_int(cfg, "mamba_head_dim", default=0) or 0,
        mamba_state=_int(cfg, "ssm_state_size", "mamba_d_state", default=0) or 0,
        mamba_groups=_int(cfg, "n_groups", "mamba_n_groups", default=1) or 1,
        mamba_conv_kernel=_int(cfg, "conv_kernel", "mamba_d_conv", default=4) or 4,
        state_dtype=state_dtype,
        intermediate=intermediate, gated_mlp=gated,
        n_experts=n_experts, top_k=top_k, moe_intermediate=moe_inter or 0,
        moe_latent=_int(cfg, "moe_latent_size", default=0) or 0,
        shared_intermediate=shared_inter, shared_gate=shared_gate,
        tie_embeddings=bool(_get(config, "tie_word_embeddings", default=cfg.get("tie_word_embeddings", False))),
        max_position=_int(cfg, "max_position_embeddings", default=None),
    )
    _validate(arch)
    return arch


def _validate(a: ModelArch) -> None:
    need_attn = any(l.mixer in ("full", "sliding") for l in a.layers)
    if need_attn and not (a.n_heads and a.n_kv_heads and a.head_dim):
        raise ConfigError("attention layers need num_attention_heads, num_key_value_heads and head_dim")
    if any(l.mixer == "mla" for l in a.layers) and not (a.kv_lora_rank and a.qk_rope_head_dim):
        raise ConfigError("MLA layers need kv_lora_rank and qk_rope_head_dim")
    if any(l.mixer == "linear" for l in a.layers) and not (a.lin_v_heads and a.lin_k_dim and a.lin_v_dim):
        raise ConfigError("linear-attention layers need linear_num_value_heads, linear_key_head_dim, linear_value_head_dim")
    if any(l.mixer == "mamba" for l in a.layers) and not (a.mamba_heads and a.mamba_head_dim and a.mamba_state):
        raise ConfigError("Mamba layers need mamba_num_heads, mamba_head_dim and ssm_state_size")
    if any(l.ffn == "moe" for l in a.layers) and not (a.n_experts and a.top_k and a.moe_intermediate):
        raise ConfigError("MoE layers need the expert count, experts per token and expert width")
    if a.top_k > a.n_experts:
        raise ConfigError(f"experts per token ({a.top_k}) exceeds the expert count ({a.n_experts})")
    if any(l.ffn == "dense" for l in a.layers) and not a.intermediate:
        raise ConfigError("dense MLP layers need intermediate_size")


# ---------------------------------------------------------------- parameter counts


@dataclass
class Params:
    """Parameter counts of one model, by component (floats: counts, not bytes)."""

    attention: float = 0.0         # full / sliding / MLA projections
    linear_attention: float = 0.0  # Gated DeltaNet and Mamba-2 in/out projections
    dense_mlp: float = 0.0
    shared_experts: float = 0.0
    routed_experts: float = 0.0
    moe_latent: float = 0.0        # LatentMoE down/up projections around the experts
    router: float = 0.0
    embeddings: float = 0.0
    lm_head: float = 0.0           # 0 when tied (the embedding matrix is read instead)
    small: float = 0.0             # norms, conv1d, A_log, dt_bias, D, shared-expert gate
    extra: float = 0.0             # memory-only parts (vision encoder ...), never read in decode
    per_expert: float = 0.0        # one routed expert of one MoE layer
    moe_layers: int = 0

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("attention", "linear_attention", "dense_mlp", "shared_experts",
                                               "routed_experts", "moe_latent", "router", "embeddings",
                                               "lm_head", "small", "extra")}

    @property
    def total(self) -> float:
        return sum(self.as_dict().values())


def mixer_params(a: ModelArch, mixer: str) -> tuple[float, float]:
    """(projection params, small params) of one mixer layer."""
    h = a.hidden
    if mixer in ("full", "sliding"):
        q = h * a.n_heads * a.head_dim * (2 if a.attn_output_gate else 1)
        kv = 2 * h * a.n_kv_heads * a.head_dim
        o = a.n_heads * a.head_dim * h
        return q + kv + o, 2 * a.head_dim + h  # q/k norms + input norm
    if mixer == "mla":
        qk_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        v_dim = a.v_head_dim or a.qk_nope_head_dim
        if a.q_lora_rank:
            q = h * a.q_lora_rank + a.q_lora_rank * a.n_heads * qk_head
        else:
            q = h * a.n_heads * qk_head
        kv_a = h * (a.kv_lora_rank + a.qk_rope_head_dim)
        kv_b = a.kv_lora_rank * a.n_heads * (a.qk_nope_head_dim + v_dim)
        o = a.n_heads * v_dim * h
        return q + kv_a + kv_b + o, h + a.kv_lora_rank + (a.q_lora_rank or 0)
    if mixer == "linear":
        key_dim = a.lin_k_heads * a.lin_k_dim
        value_dim = a.lin_v_heads * a.lin_v_dim
        proj = h * (2 * key_dim + 2 * value_dim) + value_dim * h  # in_proj_qkvz + out_proj
        conv_dim = 2 * key_dim + value_dim
        small = h * 2 * a.lin_v_heads + conv_dim * a.lin_conv_kernel + 2 * a.lin_v_heads + a.lin_v_dim + h
        return proj, small  # in_proj_ba, conv1d, A_log, dt_bias, norms stay in `small`
    if mixer == "mamba":
        d_inner = a.mamba_heads * a.mamba_head_dim
        gs = 2 * a.mamba_groups * a.mamba_state
        proj = h * (2 * d_inner + gs + a.mamba_heads) + d_inner * h
        small = (d_inner + gs) * (a.mamba_conv_kernel + 1) + 3 * a.mamba_heads + d_inner + h
        return proj, small
    raise ValueError(mixer)


def ffn_params(a: ModelArch, ffn: str) -> dict:
    h = a.hidden
    mats = 3 if a.gated_mlp else 2
    if ffn == "dense":
        return {"dense_mlp": mats * h * a.intermediate, "small": h}
    in_dim = a.moe_latent or h
    per_expert = mats * in_dim * a.moe_intermediate
    return {
        "routed_experts": a.n_experts * per_expert,
        "per_expert": per_expert,
        "shared_experts": mats * h * a.shared_intermediate,
        "moe_latent": 2 * h * a.moe_latent if a.moe_latent else 0,
        "router": h * a.n_experts,
        "small": h + (h if a.shared_gate else 0),
    }


def count_params(a: ModelArch) -> Params:
    p = Params()
    for layer in a.layers:
        if layer.mixer:
            proj, small = mixer_params(a, layer.mixer)
            if layer.mixer in ("linear", "mamba"):
                p.linear_attention += proj
            else:
                p.attention += proj
            p.small += small
        if layer.ffn:
            f = ffn_params(a, layer.ffn)
            p.dense_mlp += f.get("dense_mlp", 0)
            p.routed_experts += f.get("routed_experts", 0)
            p.shared_experts += f.get("shared_experts", 0)
            p.moe_latent += f.get("moe_latent", 0)
            p.router += f.get("router", 0)
            p.small += f.get("small", 0)
            if layer.ffn == "moe":
                p.per_expert = f["per_expert"]
                p.moe_layers += 1
    p.embeddings = a.vocab * a.hidden
    p.lm_head = 0 if a.tie_embeddings else a.vocab * a.hidden
    p.small += a.hidden  # final norm
    p.extra = float(sum(v.get("params", 0) if isinstance(v, dict) else v for v in a.extra_params.values()))
    return p


def active_params(a: ModelArch, p: Params) -> float:
    """Parameters one token multiplies through (the basis of 2*N FLOPs per token)."""
    lm = p.lm_head if p.lm_head else p.embeddings
    experts = p.moe_layers * a.top_k * p.per_expert
    return (p.attention + p.linear_attention + p.dense_mlp + p.shared_experts + p.moe_latent
            + p.router + experts + lm)


# ---------------------------------------------------------------- packaged models


def _models_dir():
    return resources.files("vllm_spark_plugin.plan") / "models"


def builtin_models() -> dict[str, dict]:
    """name -> packaged JSON document."""
    out = {}
    for entry in _models_dir().iterdir():
        if entry.name.endswith(".json"):
            doc = json.loads(entry.read_text(encoding="utf-8"))
            out[doc["name"]] = doc
    return dict(sorted(out.items()))


def _lookup_builtin(name: str) -> dict | None:
    key = name.strip().lower()
    for n, doc in builtin_models().items():
        names = [n] + list(doc.get("aliases", []))
        if key in (x.lower() for x in names):
            return doc
    return None


def arch_from_document(doc: dict) -> ModelArch:
    a = parse_config(doc["config"], name=doc["name"])
    a.extra_params = dict(doc.get("extra_params", {}))
    return a


def load_model(spec: str) -> tuple[ModelArch, dict]:
    """A built-in name or a path to a config.json (or a checkpoint folder holding one).

    Returns the architecture and the packaged document ({} for a user config).
    """
    doc = _lookup_builtin(spec)
    if doc is not None:
        return arch_from_document(doc), doc
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        names = ", ".join(builtin_models())
        if spec.endswith(".json") or "/" in spec or path.suffix:
            raise ConfigError(f"config file not found: {spec}")
        raise ConfigError(f"unknown model {spec!r}: not a built-in name ({names}) and no such config file")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    return parse_config(config, name=path.parent.name or path.stem), {}
