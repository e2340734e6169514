#!/usr/bin/env bash
# The vLLM release window, proved on real installs of each release (vllm_spark_plugin/vllm/releases.py
# lists them): for each, an environment (scripts/release-env.sh), the port's contract tests against
# that release's classes (tests/contract/test_vllm_port.py; test_admission_path.py: what decides
# admission into RUNNING against the guard's levers, on the real Scheduler), and, for releases with
# a CPU build, a real `vllm serve` with the plugin under streaming load
# (tests/integration/test_exporter_e2e.py: the exporter's invariants, the live knee;
# tests/integration/test_delivery_clock.py: the per-stream rate against clients) and the NVFP4
# checkpoint served through the plugin's config (tests/integration/test_nvfp4_serve.py: one server;
# the comparison with the dequantised checkpoint, a second server, runs on the main release only).
# Writes runs/release-matrix/ (JUnit XML per release and check, matrix.md, matrix.json) and prints
# the release x feature table.
#
#   bash scripts/release-matrix.sh              every release in the list
#   bash scripts/release-matrix.sh 0.29.0 ...   these releases
#   bash scripts/release-matrix.sh --ci         the releases CI checks (CI_RELEASES)
#
# Exit status: 0 when every check of every release passed (releases that cannot be installed here
# are reported, not failed), 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=runs/release-matrix
mkdir -p "$OUT"
PY=${PYTHON:-python3}
RELEASES_DIR=${SPARK_RELEASES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-spark/releases}  # as release-env.sh
releases() {  # releases.py needs nothing but Python
  PYTHONPATH=. "$PY" -c "import sys; from vllm_spark_plugin.vllm import releases as r; print(*(r.CI_RELEASES if sys.argv[1] == 'ci' else r.RELEASES))" "$1"
}
how() { PYTHONPATH=. "$PY" -c "import sys; from vllm_spark_plugin.vllm import releases as r; print(r.RELEASES.get(sys.argv[1], 'cpu'))" "$1"; }

if [ "${1:-}" = "--ci" ]; then versions=$(releases ci); shift; elif [ $# -gt 0 ]; then versions="$*"; else versions=$(releases all); fi
rc=0
for v in $versions; do
  kind=$(how "$v")
  rm -f "$OUT/$v-"*.xml "$OUT/$v.unavailable"
  case "$kind" in
    cpu|cuda) ;;
    *) echo "release-matrix: $v: $kind"; echo "$kind" > "$OUT/$v.unavailable"; continue ;;
  esac
  echo "release-matrix: $v ($kind build)"
  if ! bash scripts/release-env.sh "$v" "$kind"; then
    echo "environment failed" > "$OUT/$v.unavailable"; rc=1; continue
  fi
  py=$RELEASES_DIR/vllm-$v/bin/python
  t0=$SECONDS
  "$py" -m pytest -p no:cacheprovider -q tests/contract/test_vllm_port.py tests/contract/test_admission_path.py \
    --junitxml "$OUT/$v-contract.xml" || rc=1
  if [ "$kind" = cpu ]; then
    SPARK_TEST_ARTIFACTS=$PWD/$OUT/$v-artifacts "$py" -m pytest -p no:cacheprovider -q \
      tests/integration/test_exporter_e2e.py tests/integration/test_delivery_clock.py \
      tests/integration/test_nvfp4_serve.py::test_nvfp4_served_through_the_plugin_config --junitxml "$OUT/$v-serve.xml" || rc=1
  fi
  echo "release-matrix: $v checked in $((SECONDS - t0)) s"
done
"$PY" tools/release_matrix.py "$OUT" || rc=1
exit $rc
