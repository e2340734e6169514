#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set up, then run every test (real vLLM servers,
# Prometheus, promtool, Chromium included).  Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1
set +e
# Without arguments: everything but the peer cross-check against `vllm bench serve`, whose 10%
# throughput bound is at the mercy of two shared cores (run it with: bash scripts/test.sh -m peer).
if [ $# -eq 0 ]; then set -- -m "not peer"; fi
.venv/bin/python -m pytest -p no:cacheprovider -ra --durations=15 "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "test: no tests were collected"; exit 1; fi
exit $rc
