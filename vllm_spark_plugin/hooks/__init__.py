"""The inbound side of the vLLM port: the only code vLLM calls.

`registration` (the general-plugin entry, in every process), `scheduler` (the per-step hook in the
engine core), `channel` (how engine core and workers reach the API server), `stats` (reading vLLM's
stats objects), `stat_logger` (the stat-logger entry, API server), `nvfp4_claim` and
`nvfp4_methods` (the quantization config and its layer methods), `roles`.

Every place where the plugin patches or subclasses vLLM is listed in `PATCHES`: what it touches,
why, the releases it was checked on, and what would let it go.  Adding a release to the window means
checking each entry (docs/vllm-releases.md has the facts per release; `scripts/release-matrix.sh`
proves them on real installs).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    name: str
    touches: str  # the vLLM object patched or subclassed
    kind: str  # "wrap" (monkeypatch), "subclass", "register" (a public registry), "entry point"
    why: str
    checked: str  # vLLM releases checked on real installs
    removal: str  # what would let the plugin drop it


PATCHES = (
    Patch("scheduler_hook", "vllm.v1.core.sched.scheduler.Scheduler.schedule / .update_from_output", "wrap",
          "per-step wall time, prefill/decode composition and free KV blocks exist only in the engine core; "
          "vLLM's stats carry neither the step's duration nor its exact batch",
          "0.27.1, 0.29.0, 0.32.0 (served); 0.33.0 (classes and signatures)",
          "vLLM handing per-step iteration details to stat-logger plugins (upstream vllm#53550, "
          "StatLoggerRequirements) or emitting forward-pass metrics (vllm#52061)"),
    Patch("stat_logger", "vllm.v1.metrics.loggers.StatLoggerBase", "entry point",
          "the API server's per-step stats (TTFT, finished requests, running/waiting, KV usage)",
          "0.27.1, 0.29.0, 0.32.0 (served); 0.33.0 (classes and signatures)",
          "none needed: vllm.stat_logger_plugins is vLLM's public extension point"),
    Patch("nvfp4_claim", "vllm.model_executor.layers.quantization.register_quantization_config", "register",
          "claim ModelOpt NVFP4 checkpoints on GB10 and on devices without FP4 kernels",
          "0.27.1, 0.29.0, 0.32.0 (served with an NVFP4 checkpoint); 0.33.0 (classes)",
          "vLLM choosing a correct NVFP4 MoE backend on SM12x by itself and running NVFP4 without CUDA"),
    Patch("nvfp4_methods", "ModelOptNvFp4Config, ModelOptNvFp4FusedMoE, UnquantizedFusedMoEMethod, "
          "UnquantizedLinearMethod (+ WEIGHT_LOADER_V2_SUPPORTED)", "subclass",
          "the GB10 MoE backend policy, and the reference (dequantise-at-load) path on the CPU",
          "0.27.1, 0.29.0, 0.32.0 (served); 0.33.0 (classes)",
          "as for nvfp4_claim"),
    Patch("tuned_configs", "VLLM_TUNED_CONFIG_FOLDER (environment)", "register",
          "GB10 Triton fused-MoE configs vLLM does not ship",
          "0.27.1, 0.29.0, 0.32.0, 0.33.0",
          "vLLM shipping GB10 configs for the shapes in moe/configs"),
)
