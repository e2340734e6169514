"""The `spark_nvfp4` quantization method as vLLM sees it at plugin load: a light class that claims
ModelOpt NVFP4 checkpoints; its `from_config` builds the real config (`hooks.nvfp4_methods`).

Registered in `hooks.PATCHES`.
"""
from __future__ import annotations

from vllm_spark_plugin.vllm.platform import device_capability, has_cuda

SPARK_NVFP4 = "spark_nvfp4"          # the --quantization name the plugin registers
NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")


def claims_device() -> bool:
    """Devices where the plugin claims ModelOpt NVFP4 checkpoints unasked: GB10-class (12.x) and
    devices without CUDA (no FP4 kernels: the reference path)."""
    if not has_cuda():
        return True
    cap = device_capability()
    return cap is not None and cap[0] == 12


def _modelopt_algo(hf_quant_cfg) -> str | None:
    if not isinstance(hf_quant_cfg, dict):
        return None
    if not str(hf_quant_cfg.get("quant_method", "")).lower().startswith("modelopt"):
        return None
    inner = hf_quant_cfg.get("quantization")
    algo = inner.get("quant_algo") if isinstance(inner, dict) else hf_quant_cfg.get("quant_algo")
    return str(algo or "").upper() or None


def register_nvfp4_quantization() -> bool:
    """Register `spark_nvfp4` with vLLM (idempotent).  Registers a light class whose
    `from_config` builds the real config on first use, so plugin loading imports nothing heavy.
    The caller checks `capabilities.nvfp4_config()` first."""
    from vllm.model_executor.layers import quantization as q
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    existing = getattr(q, "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG", {}).get(SPARK_NVFP4)
    if existing is not None and getattr(existing, "_spark_claim", False):
        return True

    class SparkNvFp4Claim(QuantizationConfig):
        """Claims ModelOpt NVFP4 checkpoints; `from_config` returns the real `SparkNvFp4Config`."""

        _spark_claim = True

        def get_name(self):
            return SPARK_NVFP4

        def get_supported_act_dtypes(self):
            import torch
            return [torch.bfloat16, torch.half]

        @classmethod
        def get_min_capability(cls) -> int:
            return 75

        @staticmethod
        def get_config_filenames() -> list[str]:
            return ["hf_quant_config.json"]

        @classmethod
        def from_config(cls, config):
            from vllm_spark_plugin.hooks.nvfp4_methods import SparkNvFp4Config
            return SparkNvFp4Config.from_config(config)

        def get_quant_method(self, layer, prefix):
            raise NotImplementedError("SparkNvFp4Claim only claims checkpoints")

        @classmethod
        def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
            if user_quant not in (None, SPARK_NVFP4):
                return None  # the user named another method (e.g. modelopt_fp4): leave it to vLLM
            if _modelopt_algo(hf_quant_cfg) not in NVFP4_ALGOS:
                return None
            if user_quant == SPARK_NVFP4 or claims_device():
                return SPARK_NVFP4
            return None

    q.register_quantization_config(SPARK_NVFP4)(SparkNvFp4Claim)
    return True


STATE: dict = {"registered": False, "reason": "not tried"}  # for vllm_spark_info and doctor


def install(patch, settings, on_error, role: str = "", **_context) -> bool:
    """Register the NVFP4 config where the installed vLLM has every piece it builds on (the probe);
    the API server says once why not."""
    import logging
    from vllm_spark_plugin.vllm import capabilities
    try:
        cap = getattr(capabilities, patch.probe)()
        if not cap.ok:
            STATE.update(registered=False, reason=cap.reason)
            if role == "api_server":
                logging.getLogger("vllm_spark_plugin").warning(
                    "vllm-spark-plugin: NVFP4 config not registered: vLLM %s lacks %s",
                    capabilities.vllm_version(), cap.reason)
            return False
        register_nvfp4_quantization()
        STATE.update(registered=True, reason=cap.reason)
        return True
    except Exception as exc:
        STATE.update(registered=False, reason=f"{type(exc).__name__}: {exc}")
        on_error("quant_config_register", exc)
        return False
