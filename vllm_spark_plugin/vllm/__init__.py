"""The outbound side of the vLLM port: what the plugin asks vLLM.

`platform` (version, device, config accessors), `capabilities` (what the installed release offers,
feature by feature) and `kernels` (vLLM's NVFP4 reference code, MoE backend availability, tuning
calls).  This package imports nothing from the plugin; the domain packages reach vLLM only through
it, and the inbound side (what vLLM calls) is `vllm_spark_plugin.hooks`.
"""
