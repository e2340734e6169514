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
# The other environments the run needs are built in the background, side by side (installs wait on
# the package registry and the disk more than on the CPU: one after another they took most of a
# fresh run's set-up): the release window's (CI_RELEASES, the 0.34.0 CUDA build among them: its
# libraries are what the FP4 kernel-payload checks in tests/contract read, so one CUDA environment
# serves both; scripts/release-matrix.sh --ci then finds them ready), the sweep tools'
# (tests/integration/test_sweep_tools.py) and vLLM's router's (tests/integration/test_router.py).  Meanwhile the unit tier and the contract tier run: they
# judge nothing by the wall clock and need none of these environments.  The integration tier starts
# when every install is done, so no install runs beside a timed server.  Each install logs to
# .cache/prepare-NAME.log; one that fails here fails again, with its reason, in the step that needs it.
prepare() {  # prepare NAME command...: in the background, never fails the script
  ( name=$1 t0=$SECONDS; shift
    if "$@" >".cache/prepare-$name.log" 2>&1; then echo "test: $name ready ($((SECONDS - t0)) s)"
    else echo "test: preparing $name failed (.cache/prepare-$name.log); the step that needs it says why"; fi ) &
}
for rel in $(PYTHONPATH=. .venv/bin/python -c "from vllm_spark_plugin.vllm import releases as r
print(*(f'{v}:{r.RELEASES.get(v, \"cpu\")}' for v in r.CI_RELEASES))"); do
  v=${rel%%:*} kind=${rel#*:}
  case "$kind" in cpu|cuda) prepare "vllm-$v" bash scripts/release-env.sh "$v" "$kind" ;; esac
done
prepare aiperf bash scripts/tool-env.sh aiperf
prepare guidellm bash scripts/tool-env.sh guidellm  # after set-up: it reuses .venv's CPU torch
prepare vllm-router bash scripts/router-env.sh  # vLLM's router (tests/integration/test_router.py)
# the contract checks that read the 0.34.0 CUDA build's libraries wait for it (below)
NEEDS_RELEASE_ENV=tests/contract/test_fp4_payload.py
rc=0
if [ $# -eq 0 ]; then
  # one worker per core: the unit tier has no shared server, each test its own fake and registry
  run_pytest .venv/bin/python -ra -n auto tests/unit || rc=$?
  # the contract tier too: real vLLM classes and fresh interpreters, nothing judged by the clock
  run_pytest .venv/bin/python -ra -n auto --durations=10 tests/contract --deselect "$NEEDS_RELEASE_ENV" || rc=$?
  wait  # the environments prepared above: no install runs beside the integration tier
  run_pytest .venv/bin/python -ra --durations=15 "$NEEDS_RELEASE_ENV" tests/integration || rc=$?
  bash scripts/release-matrix.sh --ci || rc=$?
else
  wait
  run_pytest .venv/bin/python -ra --durations=15 "$@" || rc=$?
fi
exit $rc
