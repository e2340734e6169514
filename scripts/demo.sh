#!/usr/bin/env bash
# The main job on the embedded default: set up, serve the tiny model with the plugin, find its knee
# and its capacity at 60 tok/s with the adaptive sweep (`vllm-spark bench --levels auto`), write the
# report, then print the live knee from /metrics beside the offline one.  About 2 minutes after
# set-up on 2 cores.  Arguments go to `vllm-spark demo` (e.g. --keep-serving, --floor 48).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/vllm-spark demo "$@"
