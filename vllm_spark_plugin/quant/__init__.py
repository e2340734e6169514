"""NVFP4 for vLLM on GB10: the format (`nvfp4`), the converter (`convert`), checkpoint validation
(`checkpoint`) and the unified-memory guard (`memory_guard`).  The `spark_nvfp4` quantization config
vLLM instantiates lives on the inbound side of the port (`hooks.nvfp4_claim`, `hooks.nvfp4_methods`).
"""
