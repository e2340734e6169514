"""The NVFP4 config and method classes vLLM instantiates for a `spark_nvfp4` model: ordinary
subclasses of vLLM's ModelOpt NVFP4 classes, importable by name in the engine and worker processes
(the config is pickled to them).  Imported only once vLLM builds a `spark_nvfp4` model, and only where
`capabilities.nvfp4_config()` passed.

Registered in `hooks.PATCHES`.
"""
from __future__ import annotations

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import WEIGHT_LOADER_V2_SUPPORTED, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config, ModelOptNvFp4FusedMoE
from vllm.model_executor.parameter import ModelWeightParameter, PerTensorScaleParameter
from vllm.model_executor.utils import replace_parameter

from vllm_spark_plugin.quant import nvfp4 as fmt
from vllm_spark_plugin.vllm import quirks
from vllm_spark_plugin.vllm.capabilities import (
    modelopt_linear_method_class,
    moe_layer_class,
    unquantized_moe_method_class,
)
from vllm_spark_plugin.vllm.platform import has_cuda

MODELOPT_FP4 = "modelopt_fp4"  # the checkpoint format name vLLM's model code keys on
MoELayer = moe_layer_class()  # RoutedExperts from 0.32, FusedMoE before
UnquantizedFusedMoEMethod = unquantized_moe_method_class()
ModelOptLinearMethod = modelopt_linear_method_class()  # renamed in 0.30


class SparkNvFp4Config(ModelOptNvFp4Config):
    """ModelOpt NVFP4 with the GB10 MoE policy; on devices without CUDA, the reference path
    (dequantise to bf16 at load, vLLM's unquantised linear and MoE)."""

    def get_name(self):
        # The checkpoint format: vLLM's model code keys ModelOpt-NVFP4 workarounds on it.
        return MODELOPT_FP4

    def maybe_update_config(self, model_name, hf_config=None, revision=None):
        super().maybe_update_config(model_name, hf_config, revision)
        self._spark_model_path = model_name
        from vllm_spark_plugin.quant import checkpoint
        checkpoint.validate_at_load(model_name, group_size=getattr(self, "group_size", None))

    def get_quant_method(self, layer, prefix):
        from vllm_spark_plugin import settings
        from vllm_spark_plugin.quant import startup
        startup.once_per_process(self, settings.current().memory_guard)
        reference = not has_cuda()
        if isinstance(layer, MoELayer) and not self.is_layer_excluded(prefix):
            cls = SparkModelOptNvFp4ReferenceMoE if reference else SparkModelOptNvFp4FusedMoE
            return cls(quant_config=self, moe_config=layer.moe_config)
        if reference:  # 0.26-0.29 build the linear method from this attribute (and pick a kernel at once)
            self.LinearMethodCls = SparkNvFp4ReferenceLinearMethod
        method = super().get_quant_method(layer, prefix)
        if reference and isinstance(method, ModelOptLinearMethod):  # 0.30 on: vLLM's, replaced
            return SparkNvFp4ReferenceLinearMethod(self)
        return method

class SparkModelOptNvFp4FusedMoE(ModelOptNvFp4FusedMoE):
    """vLLM's ModelOpt NVFP4 MoE method; the backend comes from the plugin's GB10 policy unless
    vLLM's --moe-backend names one."""

    def __init__(self, quant_config, moe_config):
        from vllm_spark_plugin import settings
        from vllm_spark_plugin.moe import policy, startup
        if quirks.moe_backend_choice(moe_config):  # releases without --moe-backend: vLLM's own choice
            decision = startup.decide_once(moe_config, quant_config, settings.current().moe_backend)
            if moe_config.moe_backend == policy.AUTO and decision.backend not in (policy.AUTO, policy.REFERENCE):
                moe_config.moe_backend = decision.backend
        super().__init__(quant_config, moe_config)

class SparkModelOptNvFp4ReferenceMoE(UnquantizedFusedMoEMethod):
    """Loads the NVFP4 expert tensors, dequantises them to the model dtype after loading and
    runs vLLM's unquantised MoE.  ("ModelOpt" in the name routes vLLM's weight loader through
    its ModelOpt branch: per-tensor weight_scale_2 and per-shard input_scale.)"""

    def __init__(self, quant_config, moe_config):
        super().__init__(moe_config)
        self.quant_config = quant_config
        self.use_global_sf = False
        from vllm_spark_plugin import settings
        from vllm_spark_plugin.moe import startup
        startup.decide_once(moe_config, quant_config, settings.current().moe_backend)

    def uses_weight_scale_2_pattern(self) -> bool:
        return True

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition,
                       params_dtype, **extra_weight_attrs):
        ModelOptNvFp4FusedMoE.create_weights(self, layer, num_experts, hidden_size,
                                             intermediate_size_per_partition, params_dtype,
                                             **extra_weight_attrs)
        layer.w13_weight_scale_2.data.fill_(float("nan"))  # detect tensors never loaded
        layer.w2_weight_scale_2.data.fill_(float("nan"))

    def process_weights_after_loading(self, layer) -> None:
        name = getattr(layer, "layer_name", "experts")
        for p in ("w13_weight_scale_2", "w2_weight_scale_2"):
            if bool(torch.isnan(getattr(layer, p)).any()):
                raise RuntimeError(f"NVFP4 {name}.{p} was never loaded: the checkpoint lacks "
                                   "some experts' weight_scale_2 tensors")
        dtype = layer.params_dtype
        inter = layer.w13_weight.shape[1] // 2
        s2 = layer.w13_weight_scale_2.data
        if self.moe.is_act_and_mul:
            halves = [fmt.dequantize(layer.w13_weight.data[:, r0:r0 + inter],
                                     layer.w13_weight_scale.data[:, r0:r0 + inter], s2[:, j], dtype)
                      for j, r0 in enumerate((0, inter))]
            w13 = torch.cat(halves, dim=1)
        else:
            w13 = fmt.dequantize(layer.w13_weight.data, layer.w13_weight_scale.data, s2[:, 0], dtype)
        w2 = fmt.dequantize(layer.w2_weight.data, layer.w2_weight_scale.data,
                            layer.w2_weight_scale_2.data, dtype)
        for p in ("w13_weight_scale", "w2_weight_scale", "w13_weight_scale_2", "w2_weight_scale_2",
                  "w13_input_scale", "w2_input_scale"):
            if hasattr(layer, p):
                delattr(layer, p)
        replace_parameter(layer, "w13_weight", w13)
        replace_parameter(layer, "w2_weight", w2)
        super().process_weights_after_loading(layer)

class SparkNvFp4ReferenceLinearMethod(UnquantizedLinearMethod):
    """Loads a ModelOpt NVFP4 linear (weight, weight_scale, weight_scale_2, input_scale), then
    dequantises each fused shard with its own global scale and runs vLLM's unquantised GEMM."""

    def __init__(self, quant_config) -> None:
        super().__init__()
        self.group_size = quant_config.group_size

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, **extra_weight_attrs):
        wl = extra_weight_attrs.get("weight_loader")
        if input_size_per_partition % self.group_size:
            raise ValueError(f"NVFP4 linear with in_features={input_size_per_partition}, "
                             f"not a multiple of the group size {self.group_size}")
        n = sum(output_partition_sizes)
        layer.logical_widths = list(output_partition_sizes)
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = n
        layer.params_dtype = params_dtype
        k = input_size_per_partition
        layer.register_parameter("weight", ModelWeightParameter(
            data=torch.empty(n, k // 2, dtype=torch.uint8), input_dim=1, output_dim=0, weight_loader=wl))
        scale = ModelWeightParameter(data=torch.empty(n, k // self.group_size, dtype=torch.float8_e4m3fn),
                                     input_dim=1, output_dim=0, weight_loader=wl)
        scale.data.fill_(float("nan"))
        layer.register_parameter("weight_scale", scale)
        for p in ("weight_scale_2", "input_scale"):
            t = PerTensorScaleParameter(data=torch.full((len(output_partition_sizes),), float("nan"),
                                                        dtype=torch.float32), weight_loader=wl)
            layer.register_parameter(p, t)

    def process_weights_after_loading(self, layer) -> None:
        name = getattr(layer, "prefix", "") or type(layer).__name__
        if bool(torch.isnan(layer.weight_scale.data.float()).any()) or \
                bool(torch.isnan(layer.weight_scale_2.data).any()):
            raise RuntimeError(f"NVFP4 weight_scale/weight_scale_2 of {name} was never loaded "
                               "(the checkpoint stores this layer unquantised or lacks the scale); "
                               "add it to the exclude list")
        parts, r0 = [], 0
        for i, width in enumerate(layer.logical_widths):
            parts.append(fmt.dequantize(layer.weight.data[r0:r0 + width],
                                        layer.weight_scale.data[r0:r0 + width],
                                        layer.weight_scale_2.data[i], layer.params_dtype))
            r0 += width
        for p in ("weight_scale", "weight_scale_2", "input_scale"):
            delattr(layer, p)
        layer.weight = Parameter(torch.cat(parts, dim=0), requires_grad=False)
        super().process_weights_after_loading(layer)


WEIGHT_LOADER_V2_SUPPORTED.append(SparkNvFp4ReferenceLinearMethod.__name__)
