"""`scripts/gpu-check.sh`: the plugin's GPU side checked on a real CUDA device and a real NVML, in
minutes, with PyTorch and `nvidia-ml-py` only (no vLLM, no network).  `docs/gpu-check.md` says how to
run it, what each check proves and does not prove, the JSON format and the exit codes.

* `report`    - a check's verdict (pass, fail, n/a with its reason), the JSON and text written as
                the checks finish, exit codes;
* `env`       - where the checks run: a CUDA device with the real `pynvml` (`GpuEnv`), or the dry
                run (`DryEnv`): CPU tensors and `fake_nvml.FakeNvml`, so the same check code runs
                in the unit tier between loans of a GPU machine;
* `fake_nvml` - the dry run's NVML: a `pynvml` look-alike (the seam `NvmlSampler` already has) whose
                energy counter is the integral of its power profile;
* `telemetry` - the plugin's NVML reader (`metrics.hardware.NvmlSampler`) against NVML read directly
                and `nvidia-smi`: energy vs the power integral over a timed matmul burn, gauges
                under load and idle, GPU memory against `torch.cuda.mem_get_info`;
* `nvfp4`     - the NVFP4 format (`quant.nvfp4`) on the device against the CPU, bit for bit, and
                the reference GEMM;
* `moe`       - the MoE self-check's reference path on the device, `tune-moe`'s CUDA-event timing,
                and the backend the policy picks for the capability the device reports;
* `render`    - the exporter's `vllm_spark_gpu_*` series on a real `/metrics` render;
* `run`       - the ordered checks and the command line (`python -m vllm_spark_plugin.gpu_check`).

Importing this package imports neither torch nor vLLM: the checks import torch when they run.
"""
