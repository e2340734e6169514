"""`python -m vllm_spark_plugin.gpu_check OUTDIR [--dry]` (what scripts/gpu-check.sh runs)."""
from vllm_spark_plugin.gpu_check.run import main

raise SystemExit(main())
