"""vLLM's NVFP4 and fused-MoE kernels as the plugin uses them: reference (de)quantisation, which
MoE backends vLLM can run for a layer, a runner for the start-up self-check, Triton tuning calls.

Part of the outbound side of the vLLM port: imports nothing from the plugin.  Each function imports
vLLM lazily, so importing this module costs nothing.
"""
from __future__ import annotations

from .platform import has_cuda


def vllm_reference_dequantize(packed, block_scale, scale_2, dtype):
    """vLLM's own reference NVFP4 dequantisation (CPU path of `dequantize_to_dtype`)."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype
    return dequantize_to_dtype(packed.cpu(), block_scale.cpu(), scale_2.cpu(), dtype, 16, swizzle=False)


def vllm_reference_quantize(x, global_scale):
    """vLLM's reference NVFP4 quantiser: (E2M1 values as fp32, block scales as fp32)."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import ref_nvfp4_quant
    return ref_nvfp4_quant(x.clone(), global_scale, 16)


def vllm_reference_quant_dequant(x, global_scale):
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import ref_nvfp4_quant_dequant
    return ref_nvfp4_quant_dequant(x, global_scale, 16)


def nvfp4_moe_backend_availability(moe_config, use_a16: bool, names) -> dict:
    """For each --moe-backend name: None when vLLM says it can run this layer's configuration
    here, else the reason (import failure, device, quant scheme...)."""
    from vllm.model_executor.layers.fused_moe import modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle
    from vllm.model_executor.layers.quantization.utils.quant_utils import kNvfp4Dynamic, kNvfp4Static

    fmt = (mk.FusedMoEActivationFormat.BatchedExperts
           if moe_config.moe_parallel_config.use_batched_activation_format
           else mk.FusedMoEActivationFormat.Standard)
    out: dict = {}
    for name in names:
        try:
            backend = oracle.map_nvfp4_backend(name)
            classes = oracle.backend_to_kernel_cls(backend)
            use_a16_here = getattr(oracle, "_use_a16", lambda b, default: default)  # 0.29 on
            akey = None if (use_a16 or use_a16_here(backend, False)) else kNvfp4Dynamic
            reasons = []
            for k_cls in classes:
                ok, reason = k_cls.is_supported_config(k_cls, moe_config, kNvfp4Static, akey, fmt)
                if ok:
                    out[name] = None
                    break
                reasons.append(reason or "unsupported configuration")
            else:
                out[name] = "; ".join(reasons) or "not supported"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def nvfp4_moe_runner(backend: str, moe_config, quant_config):
    """A self-check runner for `backend`: builds vLLM's ModelOpt NVFP4 MoE method with that
    backend on a small stand-in layer, loads the problem's weights the way the checkpoint loader
    does, runs `process_weights_after_loading` (the real weight conversion) and the kernel."""
    import dataclasses

    import torch

    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4FusedMoE

    if moe_is_parallel(moe_config):
        raise NotImplementedError("the self-check runs only without tensor/expert/data parallelism")

    def run(problem):
        t, h, inter, e, k = problem.shape
        cfg = dataclasses.replace(moe_config, num_experts=e, num_local_experts=e, num_logical_experts=e,
                                  experts_per_token=k, hidden_dim=h, intermediate_size=inter,
                                  hidden_dim_unpadded=None, intermediate_size_per_partition_unpadded=None,
                                  moe_backend=backend, in_dtype=torch.bfloat16)
        device = torch.device("cuda", torch.cuda.current_device())
        method = ModelOptNvFp4FusedMoE(quant_config, cfg)
        layer = _SelfCheckLayer(cfg, e, h, inter)
        with torch.device(device):
            method.create_weights(layer, num_experts=e, hidden_size=h, intermediate_size_per_partition=inter,
                                  params_dtype=torch.bfloat16, weight_loader=_no_loader, global_num_experts=e)
        layer.w13_weight.data.copy_(problem.w13.to(device))
        layer.w13_weight_scale.data.copy_(problem.w13_scale.to(device))
        layer.w13_weight_scale_2.data.copy_(problem.w13_scale_2.to(device)[:, None].expand(e, 2))
        layer.w2_weight.data.copy_(problem.w2.to(device))
        layer.w2_weight_scale.data.copy_(problem.w2_scale.to(device))
        layer.w2_weight_scale_2.data.copy_(problem.w2_scale_2.to(device))
        layer.w13_input_scale.data.copy_(problem.a13_scale.to(device)[:, None].expand_as(layer.w13_input_scale))
        layer.w2_input_scale.data.copy_(problem.a2_scale.to(device).expand_as(layer.w2_input_scale))
        method.process_weights_after_loading(layer)
        x = problem.x.to(device)
        if method.is_monolithic:
            out = method.apply_monolithic(layer, x, problem.router_logits.to(device))
        else:
            out = method.apply(layer, x, problem.topk_weights.to(device), problem.topk_ids.to(device), None, None)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"kernel returned {type(out).__name__}, not a tensor")
        torch.cuda.synchronize()
        return out[:, :h].float().cpu()

    return run


def moe_is_parallel(moe_config) -> bool:
    """True when the MoE layer is sharded (tensor, expert or data parallel)."""
    pc = getattr(moe_config, "moe_parallel_config", None)
    return (getattr(pc, "tp_size", 1) != 1 or bool(getattr(pc, "use_ep", False))
            or getattr(pc, "dp_size", 1) != 1)


def _no_loader(*args, **kwargs):
    raise RuntimeError("the self-check layer loads its weights directly")


def _self_check_layer_cls():
    import torch

    class SelfCheckLayer(torch.nn.Module):
        """The attributes vLLM's NVFP4 MoE weight conversion and kernels read from a RoutedExperts."""

        def __init__(self, cfg, e: int, h: int, inter: int) -> None:
            super().__init__()
            self.moe_config = cfg
            self.layer_name = "spark_moe_selfcheck"
            self.activation = cfg.activation
            self.num_experts = self.local_num_experts = self.global_num_experts = e
            self.hidden_size = h
            self.intermediate_size_per_partition = inter
            self.params_dtype = torch.bfloat16
            self.top_k = cfg.experts_per_token
            self.renormalize = True
            self.use_grouped_topk = False
            self.num_expert_group = self.topk_group = None
            self.custom_routing_function = None
            self.scoring_func = "softmax"
            self.routed_scaling_factor = 1.0
            self.e_score_correction_bias = None
            self.apply_router_weight_on_input = False
            self.expert_map = None
            self.routing_sink = None
            self.swiglu_limit = self.swiglu_alpha = self.swiglu_beta = None

        def _expert_routing_tables(self):
            return None

    return SelfCheckLayer


def _SelfCheckLayer(cfg, e, h, inter):  # noqa: N802 - a constructor
    return _self_check_layer_cls()(cfg, e, h, inter)


def nvfp4_backend_imports() -> dict:
    """Which FP4 MoE backends' Python pieces import here (doctor): name -> None or the reason."""
    import importlib
    import importlib.util

    out: dict = {}
    if not has_cuda():
        reason = "no CUDA device (vLLM CPU build): NVFP4 loads through the plugin's reference path"
        return {n: reason for n in ("marlin", "flashinfer_cutlass", "b12x", "cutlass")}
    checks = {
        "marlin": ("vllm.model_executor.layers.fused_moe.experts.marlin_moe", None),
        "flashinfer_cutlass": ("vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe", "flashinfer"),
        "b12x": ("vllm.model_executor.layers.fused_moe.b12x", "b12x"),
        "cutlass": ("vllm.model_executor.layers.fused_moe.experts.cutlass_moe", None),
    }
    for name, (module, package) in checks.items():
        try:
            if package is not None and importlib.util.find_spec(package) is None:
                out[name] = f"Python package {package!r} is not installed"
                continue
            importlib.import_module(module)
            out[name] = None
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def fused_moe_config_file_name(experts: int, n: int, dtype: str | None) -> str:
    """The file name vLLM's Triton fused MoE looks up for this device (get_config_file_name)."""
    from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name
    return get_config_file_name(experts, n, dtype)


def run_triton_fused_moe(x, w1, w2, topk_weights, topk_ids, config: dict, quant_config=None):
    """One call of vLLM's Triton fused MoE with an explicit kernel config (tuning)."""
    from vllm.model_executor.layers.fused_moe import override_config
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts
    with override_config(config):
        return fused_experts(x, w1, w2, topk_weights, topk_ids, quant_config=quant_config)


def fp8_w8a8_moe_quant_config(w1_scale, w2_scale, a1_scale, a2_scale):
    from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config as make
    return make(w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale)
