#!/usr/bin/env bash
# The plugin's GPU side checked on this machine's GPU: NVML telemetry against NVML and nvidia-smi
# under a timed matmul load, NVFP4 on CUDA tensors against the CPU, the MoE self-check and tune-moe's
# CUDA-event timing, the exporter's GPU series on a real /metrics render (docs/gpu-check.md).
#
#   bash scripts/gpu-check.sh OUTDIR          on a CUDA machine (about a minute; hard limit 8 minutes)
#   bash scripts/gpu-check.sh OUTDIR --dry    CPU tensors and an NVML fake: the same checks' logic, seconds
#
# Needs PyTorch with CUDA and nvidia-ml-py; no vLLM, no network, no install of the plugin (the
# repository is put on PYTHONPATH).  The /metrics check also needs prometheus-client and numpy (the
# exporter's imports): where this Python lacks them they are taken from wheels in .whl/ at the
# repository root (docs/gpu-check.md has the pip download lines); without them that check is "n/a".
# PYTHON picks the interpreter (default python3).
#
# Writes OUTDIR/gpu-check.json and OUTDIR/gpu-check.txt, rewritten after each check.
# Exit codes: 0 no check failed, 1 a check failed or the run stopped early, 2 usage.
set -uo pipefail

HARD_LIMIT_SECONDS=480
usage() { echo "usage: bash scripts/gpu-check.sh OUTDIR [--dry]" >&2; exit 2; }
case "${1:-}" in -h|--help) echo "usage: bash scripts/gpu-check.sh OUTDIR [--dry]  (docs/gpu-check.md)"; exit 0 ;; esac
[ $# -ge 1 ] && [ $# -le 2 ] || usage
OUT=$1
case "$OUT" in ""|-*) usage ;; esac
DRY=()
case "${2:-}" in "") ;; --dry) DRY=(--dry) ;; *) usage ;; esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || { echo "gpu-check: no Python interpreter '$PY' (set PYTHON)" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
rm -f "$OUT/gpu-check.json" "$OUT/gpu-check.txt"  # a result here is this run's, never an older one
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# Wheels in .whl/ stand in for modules this Python lacks (never for one it has): a pure-Python wheel is
# imported from the zip, a binary one (numpy, for this Python's cpXY tag) is unpacked to a temporary folder.
tag=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])' 2>/dev/null)
unpacked=()
trap 'rm -rf ${unpacked[@]+"${unpacked[@]}"}' EXIT
for pair in prometheus_client:prometheus_client nvidia_ml_py:pynvml numpy:numpy; do
  wheel_prefix=${pair%%:*}; module=${pair##*:}
  "$PY" -c "import $module" >/dev/null 2>&1 && continue
  wheel=$(ls "$ROOT"/.whl/"$wheel_prefix"-*-py3-none-any.whl "$ROOT"/.whl/"$wheel_prefix"-*-"$tag"-*.whl 2>/dev/null \
          | sort -V | tail -n 1)
  if [ -z "$wheel" ]; then
    echo "gpu-check: $module is not installed and .whl/ has no wheel of it for $tag"
    continue
  fi
  case "$wheel" in
    *-py3-none-any.whl) path=$wheel ;;
    *) path=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-wheel.XXXXXX") || continue
       unpacked+=("$path")
       "$PY" -m zipfile -e "$wheel" "$path" || continue ;;
  esac
  echo "gpu-check: $module from .whl/$(basename "$wheel")"
  export PYTHONPATH="$PYTHONPATH:$path"
done

timeout --kill-after=10 "$HARD_LIMIT_SECONDS" "$PY" -m vllm_spark_plugin.gpu_check "$OUT" ${DRY[@]+"${DRY[@]}"}
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  echo "gpu-check: stopped at the hard limit of $HARD_LIMIT_SECONDS s; $OUT holds the checks finished before it"
fi
if [ ! -s "$OUT/gpu-check.json" ]; then
  # the Python side never started (an interpreter or import failure): still leave a result
  mode=gpu; [ ${#DRY[@]} -gt 0 ] && mode=dry
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  printf '{"format": "vllm-spark-gpu-check/1", "mode": "%s", "complete": false, "started": "%s", "finished": null, "machine": {}, "summary": {"pass": 0, "fail": 1, "n/a": 0}, "checks": [{"name": "startup", "status": "fail", "detail": "the check did not start (exit code %d): see its output", "figures": {}, "seconds": 0.0, "dry": %s}]}\n' \
    "$mode" "$date" "$rc" "$([ $mode = dry ] && echo true || echo false)" > "$OUT/gpu-check.json"
  printf 'vllm-spark gpu-check (%s) %s\n[fail] startup  the check did not start (exit code %d): see its output\n1 checks: 0 passed, 1 failed, 0 not applicable\n' \
    "$mode" "$date" "$rc" > "$OUT/gpu-check.txt"
fi
case $rc in
  0) exit 0 ;;
  2) exit 2 ;;
  *) exit 1 ;;
esac
