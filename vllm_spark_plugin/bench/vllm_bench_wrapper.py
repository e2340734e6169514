"""`python -m vllm_spark_plugin.bench.vllm_bench_wrapper bench serve ...`: vLLM's own CLI, run through
the port (`vllm_spark_plugin.vllm.cli`, which says what it fixes under the CPU build)."""
from __future__ import annotations

import sys

if __name__ == "__main__":
    from vllm_spark_plugin.vllm.cli import main
    sys.exit(main())
