#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set up, then run every test (real vLLM servers,
# Prometheus, promtool, Chromium included).  Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1
set +e
.venv/bin/python -m pytest -p no:cacheprovider -ra --durations=15 "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "test: no tests were collected"; exit 1; fi
exit $rc
