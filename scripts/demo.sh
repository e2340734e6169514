#!/usr/bin/env bash
# The main job on the embedded default: set up, serve the tiny model with the plugin, sweep, report,
# show the live metrics.  Arguments go to `vllm-spark demo` (e.g. --keep-serving).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/vllm-spark demo "$@"
