#!/usr/bin/env bash
# The test suite, from a fresh machine.  Extra arguments go to pytest.
#
#   bash scripts/test.sh          everything (CI): set up, then the three tiers (tests/unit,
#                                 tests/contract, tests/integration: real vLLM servers, Prometheus,
#                                 promtool, tsc, Chromium), then the vLLM release-window checks
#                                 (scripts/release-matrix.sh --ci)
#   bash scripts/test.sh --fast   the unit tier only, in a small environment without vLLM (< 1 minute)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

run_pytest() {  # run_pytest PYTHON args...: pytest's exit code, with "no tests collected" a failure
  local py=$1; shift
  set +e
  "$py" -m pytest -p no:cacheprovider "$@"
  local rc=$?
  set -e
  if [ $rc -eq 5 ]; then echo "test: no tests were collected"; return 1; fi
  return $rc
}

if [ "${1:-}" = "--fast" ]; then
  shift
  bash scripts/setup.sh --fast
  # one worker per core: the unit tier has no shared server, each test its own fake and registry
  run_pytest .venv-fast/bin/python -q -m unit -n auto tests/unit "$@"
  exit $?
fi

bash scripts/setup.sh
# the 0.33.0 CUDA build's libraries are what the FP4 kernel-payload checks read (tests/contract):
# made here, before the tiers, not left to the release-window step that comes after them
bash scripts/release-env.sh 0.33.0 cuda
rc=0
run_pytest .venv/bin/python -ra --durations=15 "$@" || rc=$?
if [ $# -eq 0 ]; then
  bash scripts/release-matrix.sh --ci || rc=$?
fi
exit $rc
