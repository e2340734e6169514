"""Decide the NVFP4 MoE backend once per process, when the first NVFP4 MoE layer is built.

Glue between vLLM (through the port, `vllm_spark_plugin.vllm`: backend availability, the kernel runner, vLLM's reference
dequantiser) and the pure policy (`policy.decide`) and self-check (`selfcheck`).
"""
from __future__ import annotations

import logging
import threading

from vllm_spark_plugin.moe import policy, selfcheck

log = logging.getLogger("vllm_spark_plugin")
_lock = threading.Lock()
_decision: policy.Decision | None = None


def decide_once(moe_config, quant_config, setting: str = "") -> policy.Decision:
    """`setting`: the SPARK_PLUGIN_MOE_BACKEND setting, handed in by the inbound side."""
    global _decision
    with _lock:
        if _decision is not None:
            return _decision
        _decision = _decide(moe_config, quant_config, setting)
        policy.record(_decision)
        return _decision


def _decide(moe_config, quant_config, setting: str) -> policy.Decision:
    from vllm_spark_plugin.vllm import kernels, platform

    vllm_backend = str(getattr(moe_config, "moe_backend", policy.AUTO) or policy.AUTO)
    capability = platform.device_capability() if platform.has_cuda() else None
    if capability is None or not policy.is_sm12x(capability) or vllm_backend != policy.AUTO:
        return policy.decide(capability, {}, None, setting, vllm_backend)
    use_a16 = getattr(quant_config, "quant_method", "NVFP4") == "W4A16_NVFP4"
    try:
        available = kernels.nvfp4_moe_backend_availability(moe_config, use_a16, policy.SM12X_PREFERENCE)
    except Exception as exc:
        log.warning("vllm-spark-plugin: cannot enumerate NVFP4 MoE backends (%r): vLLM decides", exc)
        return policy.Decision(policy.AUTO, f"backend enumeration failed: {exc!r}", "vllm-auto")
    if kernels.moe_is_parallel(moe_config):
        # The small self-check problem cannot stand in for a sharded layer: keep the measured
        # preference order unchecked (the log says "self-check skipped").
        return policy.decide(capability, available, None, setting, vllm_backend)
    check = selfcheck.make_self_check(
        lambda name: kernels.nvfp4_moe_runner(name, moe_config, quant_config),
        dequant=kernels.vllm_reference_dequantize)
    return policy.decide(capability, available, check, setting, vllm_backend)


def reset() -> None:
    global _decision
    with _lock:
        _decision = None
    policy.reset()
