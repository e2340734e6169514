"""Decode step-time model t(b) = alpha(b) + beta * b from bytes moved and FLOPs, with efficiency factors.

Per decode step of b streams on one tensor-parallel rank:

* alpha(b) — what every step pays once:
  fixed overhead (kernels per step x kernel latency + per-step host work) x overhead_scale
  + (weights every step reads: attention / linear-attention / dense / shared experts / LatentMoE
     projections / router / lm_head) / (nominal bandwidth x bandwidth_efficiency)
  + (expected distinct routed experts touched by b tokens per MoE layer under the model's routing
     skew, plan/routing.py, x bytes per expert) / (same bandwidth) <- grows with b, saturates at E
  + collective latency (tp > 1, pp > 1);
* beta — what each stream adds:
  (KV-cache read at the context + recurrent state read and written back) / bandwidth
  + 2 x active params (+ attention math) FLOPs / (peak x compute_efficiency)
  + the size-dependent part of the collectives (Hardware.collective_seconds).

The overhead and the kernel-path factors come from the serving options (plan/engine.py: engine,
backends, --enforce-eager); with speculative decoding a step verifies 1 + N tokens per stream and
emits the mean acceptance length.  `ModelFactors` are what a calibration learned about one model.

Because of the expert term t(b) is not linear for MoE models: the knee is defined on the linear fit
t ~ alpha + beta*b of the predicted curve over b = 1..64 (K = alpha/beta, plateau 1/beta), the same
model the online estimator fits to measured steps.  Memory and compute terms are added, not
overlapped (conservative).  Pipeline parallelism runs pp micro-batches of b/pp streams, so a stream
sees t(ceil(b/pp)) plus pp-1 point-to-point hops; it buys memory, not per-stream speed.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from vllm_spark_plugin.definitions import DEFAULT_FLOOR_TOKENS_PER_SECOND, SweepPoint, capacity_at_floor
from vllm_spark_plugin.plan import routing
from vllm_spark_plugin.plan.deployment import Deployment

KNEE_FIT_RANGE = (1, 64)


@dataclass
class Efficiency:
    """Efficiency factors (defaults are reasoned in docs/plan.md, not fitted to any published point)."""

    bandwidth: float = 0.85     # fraction of NOMINAL memory bandwidth a decode step's reads achieve
    compute: float = 0.5        # fraction of the dtype's peak FLOP/s the step's GEMMs/attention achieve
    overhead_scale: float = 1.0 # multiplies the profile's kernel x latency + per-step host overhead
    source: str = "defaults"
    link_scale: float = 1.0     # multiplies the interconnect time (2+ Sparks)

    def validate(self) -> None:
        for name in ("bandwidth", "compute", "overhead_scale", "link_scale"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"efficiency {name} must be a positive number, got {v!r}")
        if self.bandwidth > 1.5:
            raise ValueError(f"bandwidth efficiency {self.bandwidth} is implausible (> 1.5 x nominal bandwidth)")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ModelFactors:
    """What calibration learns about one model, kept apart from the machine/engine factors so that a
    calibration carried to another model brings only the machine's part (docs/plan.md, "Calibration")."""

    routing_skew: float | None = None  # None: the model's published routing statistic
    overhead_scale: float = 1.0        # x the engine's per-step overhead for this model's kernels
    per_stream_scale: float = 1.0      # x the per-stream work (cache / state traffic and compute)

    def validate(self) -> None:
        if self.routing_skew is not None and not (math.isfinite(self.routing_skew) and self.routing_skew >= 0):
            raise ValueError(f"routing skew must be >= 0, got {self.routing_skew!r}")
        for name in ("overhead_scale", "per_stream_scale"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"model {name.replace('_', ' ')} must be positive, got {v!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def distinct_experts(n_experts: int, top_k: int, tokens: float, skew: float = 0.0) -> float:
    """Expected distinct experts one MoE layer touches for `tokens` tokens (plan/routing.py)."""
    return routing.distinct_experts(n_experts, top_k, tokens, skew)


class StepModel:
    def __init__(self, dep: Deployment, eff: Efficiency | None = None, model: ModelFactors | None = None):
        self.dep = dep
        self.eff = eff or Efficiency()
        self.eff.validate()
        self.model = model or ModelFactors()
        self.model.validate()
        hw, sv = dep.hw, dep.serving
        self.bandwidth = hw.bandwidth_nominal * self.eff.bandwidth
        self.compute_dtype, self.peak_flops = dep.peak()
        self.flops_rate = self.peak_flops * self.eff.compute
        a, p = dep.arch, dep.params
        bpp = dep.bytes_per_param
        tp = dep.tp
        # kernel paths: routed experts through the MoE backend, every other linear through the linear one
        self.expert_path = sv.path(dep.formats["routed_experts"], sv.moe_backend)
        self.linear_path = sv.path(dep.weight_format, sv.linear_backend)
        lm = p.lm_head * bpp("lm_head") if p.lm_head else p.embeddings * bpp("embeddings")
        self.lm_bytes = lm / tp
        # bytes every step reads once, whole model, one tp rank
        self.dense_bytes = ((p.attention * bpp("attention") + p.linear_attention * bpp("linear_attention")
                             + p.dense_mlp * bpp("dense_mlp") + p.shared_experts * bpp("shared_experts")
                             + p.moe_latent * bpp("moe_latent") + lm) / tp
                            + p.router * bpp("router") + p.small * bpp("small"))
        # with tp each rank reads 1/tp of every touched expert; with ep it reads whole experts it owns
        self.expert_bytes = p.per_expert * bpp("routed_experts") / tp
        self.moe_layers = p.moe_layers
        if dep.serving.routing_skew is None and self.model.routing_skew is not None:
            self.skew, self.skew_source = self.model.routing_skew, "calibrated"
        else:
            self.skew, self.skew_source = dep.routing_skew()
        # a token passes every pipeline stage: whole-model cache traffic (the deployment's are per node)
        self.kv_read = dep.kv_read_bytes(dep.context) * dep.pp
        self.kv_write = dep.kv_bytes_per_token() * dep.pp
        self.state_rw = dep.state_rw_bytes() * dep.pp
        self.embed_row = a.hidden * 2
        self.flops_per_token = (2 * dep.active_params() + dep.attention_flops_per_token(dep.context)) / tp
        self.kernels = dep.kernels_per_step()
        eng = sv.profile
        self.base_overhead = (self.kernels * hw.kernel_overhead_seconds * eng.kernel_scale
                              + hw.step_overhead_seconds * eng.host_scale
                              + (self.kernels * eng.eager_kernel_seconds if sv.enforce_eager else 0.0)
                              ) * self.model.overhead_scale
        self.overhead = self.base_overhead * self.eff.overhead_scale
        self.spec = sv.spec
        self.tokens_per_stream = 1 + (self.spec.num_tokens if self.spec else 0)
        self.emitted_per_step = self.spec.mean_emitted() if self.spec else 1.0

    # ------------------------------------------------------------ pieces

    def experts_touched(self, b: float) -> float:
        a = self.dep.arch
        return distinct_experts(a.n_experts, a.top_k, b, self.skew) if a.is_moe else 0.0

    def comm_seconds(self, m: float, tokens_per_stream: int = 1) -> tuple[float, float]:
        """(latency part, size-dependent part) of the per-step collectives for a micro-batch of m streams.

        tp: an all-reduce of the hidden vector of every token after each mixer and FFN; with expert
        parallelism the MoE layers' all-reduce is replaced by an all-to-all dispatch and a combine of
        each token's top-k hidden vectors, (tp-1)/tp of which leave the rank.  pp: one hop of the hidden
        vectors per stage boundary.  Each collective costs `Hardware.collective_seconds` of its bytes.
        """
        dep, hw = self.dep, self.dep.hw
        tokens = m * tokens_per_stream
        row = dep.arch.hidden * 2
        calls: list[tuple[int, float, float]] = []  # (count, bytes per rank, ring factor)
        if dep.tp > 1:
            n = dep.allreduces_per_step()
            if dep.serving.expert_parallel and self.moe_layers:
                n -= self.moe_layers
                # LatentMoE dispatches the latent vector, not the hidden one (Nemotron-3-Super: 1024 vs 4096)
                moe_row = (dep.arch.moe_latent or dep.arch.hidden) * 2
                calls.append((2 * self.moe_layers, (dep.tp - 1) / dep.tp * dep.arch.top_k * moe_row * tokens, 1.0))
            calls.append((n, row * tokens, 2 * (dep.tp - 1) / dep.tp))
        if dep.pp > 1:
            calls.append((dep.pp - 1, row * tokens, 1.0))
        lat = sum(k * hw.link_latency for k, nbytes, _ in calls if nbytes > 0)
        total = sum(k * hw.collective_seconds(nbytes, ring) for k, nbytes, ring in calls)
        return lat, total - lat

    def _raw(self, m: float, q: int) -> dict:
        """Seconds at efficiency 1 (nominal bandwidth, peak FLOP/s) of a target pass over m streams x q tokens."""
        nominal = self.dep.hw.bandwidth_nominal
        experts = self.experts_touched(m * q) * self.moe_layers * self.expert_bytes
        per_stream = self.kv_read + self.kv_write * q + self.state_rw + self.embed_row * q
        lat, cbw = self.comm_seconds(m, q)
        return {
            "overhead": self.base_overhead,
            "weights": self.dense_bytes / (nominal * self.linear_path.bandwidth_scale),
            "experts": experts / (nominal * self.expert_path.bandwidth_scale),
            "kv_and_state": m * per_stream * self.model.per_stream_scale / nominal,
            "compute": (m * q * self.flops_per_token * self.model.per_stream_scale
                        / (self.peak_flops * self.linear_path.compute_scale)),
            "comm": lat + cbw,
            "bytes": self.dense_bytes + experts + m * per_stream,
            "flops": m * q * self.flops_per_token,
            "experts_bytes": experts,
        }

    def _draft_fraction(self, raw: dict) -> float:
        """Cost of one drafted token as a fraction of a one-token target step (MTP: a layer + lm_head)."""
        if self.spec is None:
            return 0.0
        if self.spec.draft_cost is not None:
            return self.spec.draft_cost
        one_layer = (raw["overhead"] + raw["weights"] + raw["experts"]) / max(1, self.dep.arch.n_layers)
        lm = self.lm_bytes / self.dep.hw.bandwidth_nominal
        target = raw["overhead"] + raw["weights"] + raw["experts"] + raw["kv_and_state"] + raw["compute"]
        return min(1.0, (one_layer + lm) / target) if target > 0 else 0.0

    def components(self, b: float) -> dict:
        """Seconds of each term for one decode step as a stream sees it (b streams in the engine).

        The *_raw entries are the same terms at efficiency 1 (used by calibration): the step is
        overhead_scale * overhead_raw + memory_raw / bandwidth + compute_raw / compute + comm_raw.
        """
        m = max(1.0, math.ceil(b / self.dep.pp)) if self.dep.pp > 1 else max(1.0, float(b))
        q = self.tokens_per_stream
        raw = self._raw(m, q)
        draft = self.spec.num_tokens * self._draft_fraction(self._raw(m, 1)) if self.spec else 0.0
        one = self._raw(m, 1)
        scale = 1.0 + draft  # drafted tokens cost a fraction of a one-token step, in the same terms
        mem_raw = raw["weights"] + raw["experts"] + raw["kv_and_state"]
        draft_mem = draft * (one["weights"] + one["experts"] + one["kv_and_state"])
        e, c = self.eff, {}
        c["micro_batch"] = m
        c["tokens_per_stream"] = q
        c["emitted_per_step"] = self.emitted_per_step
        c["overhead"] = self.overhead * scale
        c["weights"] = raw["weights"] / e.bandwidth
        c["experts"] = raw["experts"] / e.bandwidth
        c["experts_touched_per_layer"] = self.experts_touched(m * q)
        c["kv_and_state"] = raw["kv_and_state"] / e.bandwidth
        c["draft"] = draft_mem / e.bandwidth + draft * one["compute"] / e.compute
        c["compute"] = raw["compute"] / e.compute
        c["comm"] = raw["comm"] * e.link_scale
        c["bytes"] = raw["bytes"]
        c["flops"] = raw["flops"]
        c["overhead_raw"] = self.base_overhead * scale
        c["memory_raw"] = mem_raw + draft_mem
        c["compute_raw"] = raw["compute"] + draft * one["compute"]
        c["comm_raw"] = raw["comm"]
        c["per_stream_memory_raw"] = raw["kv_and_state"] + draft * one["kv_and_state"]
        return c

    def step_seconds(self, b: float) -> float:
        c = self.components(b)
        return (c["overhead"] + c["weights"] + c["experts"] + c["kv_and_state"] + c["compute"] + c["comm"]
                + c["draft"])

    def alpha_beta_physical(self, b: float = 1) -> tuple[float, float]:
        """The physical split at batch b: alpha(b) (per step) and beta (per stream)."""
        c = self.components(b)
        m = c["micro_batch"]
        lat, cbw = (x * self.eff.link_scale for x in self.comm_seconds(m, c["tokens_per_stream"]))
        alpha = c["overhead"] + c["weights"] + c["experts"] + c["draft"] + lat
        beta = (c["kv_and_state"] + c["compute"] + cbw) / m
        return alpha, beta

    # ------------------------------------------------------------ curve, knee, capacity

    def per_stream_rate(self, b: float) -> float:
        return self.emitted_per_step / self.step_seconds(b)

    def aggregate_rate(self, b: float) -> float:
        return b * self.emitted_per_step / self.step_seconds(b)

    def linear_fit(self, lo: int = KNEE_FIT_RANGE[0], hi: int = KNEE_FIT_RANGE[1]) -> dict:
        bs = np.arange(lo, hi + 1, dtype=float)
        ts = np.array([self.step_seconds(b) for b in bs])
        beta, alpha = np.polyfit(bs, ts, 1)
        pred = alpha + beta * bs
        ss_res = float(np.sum((ts - pred) ** 2))
        ss_tot = float(np.sum((ts - ts.mean()) ** 2))
        r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
        knee = alpha / beta if beta > 0 else None
        return {"alpha_seconds": float(alpha), "beta_seconds": float(beta), "fit_range": [lo, hi],
                "r2": r2, "knee": knee, "plateau_tokens_per_second": (1.0 / beta) if beta > 0 else None,
                "max_relative_error": float(np.max(np.abs(pred - ts) / ts))}

    def prefill_seconds(self, requests: int, prompt: int) -> float:
        """Time to prefill `requests` prompts of `prompt` tokens (chunked by max_num_batched_tokens)."""
        dep = self.dep
        tokens = requests * prompt
        chunks = max(1, math.ceil(tokens / dep.max_num_batched_tokens))
        attn = sum(self._prefill_attention_flops(prompt) for _ in range(1)) * requests
        flops = (2 * dep.active_params() * tokens + attn) / dep.tp
        per_chunk_tokens = min(tokens, dep.max_num_batched_tokens)
        experts = self.experts_touched(per_chunk_tokens) * self.moe_layers * self.expert_bytes
        bytes_ = chunks * (self.dense_bytes + experts) + tokens * self.kv_write
        lat, cbw = self.comm_seconds(per_chunk_tokens)
        return (chunks * (self.overhead + lat + cbw) + max(flops / self.flops_rate, bytes_ / self.bandwidth))

    def _prefill_attention_flops(self, prompt: int) -> float:
        a = self.dep.arch
        f = 0.0
        for l in a.layers:
            if l.mixer == "full":
                f += 2 * a.n_heads * a.head_dim * prompt * prompt  # causal: half of 4*h*d*P^2
            elif l.mixer == "sliding":
                w = min(prompt, a.sliding_window or prompt)
                f += 4 * a.n_heads * a.head_dim * prompt * w
            elif l.mixer == "mla":
                f += 2 * a.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + (a.v_head_dim or a.qk_nope_head_dim)) * prompt * prompt
            elif l.mixer == "linear":
                f += 6 * a.lin_v_heads * a.lin_k_dim * a.lin_v_dim * prompt
            elif l.mixer == "mamba":
                f += 6 * a.mamba_heads * a.mamba_head_dim * a.mamba_state * prompt
        return f

    def ttft_seconds(self, b: int) -> float:
        """TTFT of one request arriving while b streams decode: its own prefill + waiting behind a step."""
        return self.prefill_seconds(1, self.dep.prompt_tokens) + self.step_seconds(b)

    def ttft_wave_median_seconds(self, b: int) -> float:
        """Median TTFT when b requests arrive together (a benchmark wave): half the prefills + a step."""
        return self.prefill_seconds(max(1, math.ceil((b + 1) / 2)), self.dep.prompt_tokens) + self.step_seconds(b)

    def capacity(self, floor: float = DEFAULT_FLOOR_TOKENS_PER_SECOND, limit: int = 256) -> dict:
        """Highest concurrency (<= limit) whose predicted per-stream rate is >= floor (seed 003)."""
        limit = max(0, int(limit))
        pts = [SweepPoint(concurrency=b, per_stream_tokens_per_second=self.per_stream_rate(b),
                          aggregate_tokens_per_second=self.aggregate_rate(b)) for b in range(1, limit + 1)]
        cap = capacity_at_floor(pts, floor=floor)
        cap = int(cap) if cap is not None else None
        return {"floor_tokens_per_second": floor, "streams": cap, "limit": limit,
                "aggregate_tokens_per_second": self.aggregate_rate(cap) if cap else None,
                "per_stream_tokens_per_second": self.per_stream_rate(cap) if cap else None}

    def curve(self, concurrencies, max_streams: int | None = None) -> list[dict]:
        out = []
        for b in concurrencies:
            t = self.step_seconds(b)
            out.append({
                "concurrency": int(b),
                "step_seconds": t,
                "per_stream_tokens_per_second": self.emitted_per_step / t,
                "aggregate_tokens_per_second": b * self.emitted_per_step / t,
                "ttft_seconds": self.ttft_seconds(b),
                "ttft_wave_median_seconds": self.ttft_wave_median_seconds(b),
                "experts_touched_per_layer": (self.experts_touched(b * self.tokens_per_stream)
                                          if self.dep.arch.is_moe else None),
                "fits_memory": None if max_streams is None else bool(b <= max_streams),
            })
        return out

    def describe(self) -> dict:
        a1, beta = self.alpha_beta_physical(1)
        dep = self.dep
        return {
            "bandwidth_bytes_per_second": self.bandwidth,
            "bandwidth_nominal_bytes_per_second": dep.hw.bandwidth_nominal,
            "bandwidth_measured_bytes_per_second": dep.hw.bandwidth_measured,
            "compute_dtype": self.compute_dtype,
            "compute_flops_per_second": self.flops_rate,
            "peak_flops_per_second": self.peak_flops,
            "fixed_overhead_seconds": self.overhead,
            "kernels_per_step": self.kernels,
            "dense_weight_bytes_per_step": self.dense_bytes,
            "bytes_per_expert": self.expert_bytes,
            "moe_layers": self.moe_layers,
            "routing_skew": self.skew,
            "routing_skew_source": self.skew_source,
            "expert_path": {"bandwidth_scale": self.expert_path.bandwidth_scale, "source": self.expert_path.source},
            "linear_path": {"bandwidth_scale": self.linear_path.bandwidth_scale, "source": self.linear_path.source},
            "tokens_per_stream_per_step": self.tokens_per_stream,
            "emitted_tokens_per_step": self.emitted_per_step,
            "kv_read_bytes_per_stream": self.kv_read,
            "state_read_write_bytes_per_stream": self.state_rw,
            "flops_per_token": self.flops_per_token,
            "alpha_at_1_seconds": a1,
            "beta_physical_seconds": beta,
        }
