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
# The other environments the run needs, built side by side in the background while the line below
# builds the contract tier's (installs wait on the package registry and the disk more than on the
# CPU; one after another they took most of a fresh run's set-up): the release window's
# (CI_RELEASES; scripts/release-matrix.sh --ci then finds them ready) and the sweep tools'
# (tests/integration/test_sweep_tools.py), so no install runs inside a tier beside a timed server.
# Each step logs to .cache/prepare-NAME.log; one that fails here fails again, with its reason, in
# the step that needs it.
prepare() {  # prepare NAME command...: in the background, never fails the script
  ( name=$1 t0=$SECONDS; shift
    if "$@" >".cache/prepare-$name.log" 2>&1; then echo "test: $name ready ($((SECONDS - t0)) s)"
    else echo "test: preparing $name failed (.cache/prepare-$name.log); the step that needs it says why"; fi ) &
}
# the release the foreground line below builds is left to it (two builds of one environment collide)
foreground=$(sed -n 's/^bash scripts\/release-env\.sh \([^ ]*\) .*/\1/p' scripts/test.sh | head -n 1)
for rel in $(PYTHONPATH=. .venv/bin/python -c "from vllm_spark_plugin.vllm import releases as r
print(*(f'{v}:{r.RELEASES.get(v, \"cpu\")}' for v in r.CI_RELEASES))"); do
  v=${rel%%:*} kind=${rel#*:}
  case "$kind" in cpu|cuda) [ "$v" = "$foreground" ] || prepare "vllm-$v" bash scripts/release-env.sh "$v" "$kind" ;; esac
done
prepare aiperf bash scripts/tool-env.sh aiperf
prepare guidellm bash scripts/tool-env.sh guidellm  # after set-up: it reuses .venv's CPU torch
# the 0.34.0 CUDA build's libraries are what the FP4 kernel-payload checks read (tests/contract); the
# release window's newest, so one CUDA environment serves both: made here, before the tiers
bash scripts/release-env.sh 0.34.0 cuda
wait  # the environments prepared above: no install runs beside the tiers
rc=0
run_pytest .venv/bin/python -ra --durations=15 "$@" || rc=$?
if [ $# -eq 0 ]; then
  bash scripts/release-matrix.sh --ci || rc=$?
fi
exit $rc
