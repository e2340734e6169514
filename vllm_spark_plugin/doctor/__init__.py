"""`vllm-spark doctor`: check the environment for serving on a DGX Spark and print concrete fixes.

What the package holds:

* `check`       - one check's row (`Check`), its statuses (ok, info, warn, fail, n/a when it does not
                  apply on this machine: its detail says why) and `contained`, the one containment
                  every check runs under;
* `registry`    - every check, one row each (`CHECKS`), and `run_checks`;
* `command`     - the command: arguments, text or JSON report, exit codes (0 nothing failed, 1 a
                  check failed, 2 bad arguments);
* `context`, `probe`, `serve_args` - what each check is handed: the environment, what doctor reads
                  from vLLM and the machine (the seam tests replace), the planned `vllm serve` flags;
* `environment` - the vLLM release and its features, the plugin's entry point, the device, FP4
                  backends, stale variables, the plugin's settings, memory, CUDA graphs, tuned configs;
* `kernels`, `fatbin` - the FP4 kernels' CUDA payload against the device's SM (`--sm 12.1` for
                  another device);
* `memory`      - vLLM's start-up memory check, reclaimable headroom, NVRM driver events, VLLM_*
                  variables the installed vLLM does not know, CUDA-graph capture sizes;
* `floors`      - the floors the Prometheus rules select against a running server's (`--endpoint`);
* `links`, `link_probe`, `link_server`, `link_wire` - the network links of a multi-node deployment,
                  and the bounded two-host TCP probe (`--link-probe` / `--link-serve`).

This module only re-exports the names callers use (`doctor.run_checks`, `doctor.Check`, ...).
"""
from __future__ import annotations

from vllm_spark_plugin.doctor.check import (  # noqa: F401  (re-exported)
    FAIL,
    INFO,
    NA,
    OK,
    STALE_ENV,
    STATUSES,
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    WARN,
    Check,
)
from vllm_spark_plugin.doctor.command import add_arguments, format_checks, run  # noqa: F401
from vllm_spark_plugin.doctor.environment import FEATURE_TEXT, stale_env_fix  # noqa: F401
from vllm_spark_plugin.doctor.probe import Probe  # noqa: F401
from vllm_spark_plugin.doctor.registry import CHECKS, run_checks  # noqa: F401
from vllm_spark_plugin.doctor.serve_args import ServeArgs, parse_serve_args  # noqa: F401
