#!/usr/bin/env bash
# vLLM's router (`vllm-router`, PyPI) in a virtual environment of its own (idempotent), so its pins
# never touch .venv's vLLM.  Prints the path of the `vllm-router` command on stdout; pip's output
# goes to the log.  Used by tests/integration/test_router.py and benchmarks/router_effect.py.
#
#   bash scripts/router-env.sh          -> ~/.cache/vllm-spark/tools/vllm-router/bin/vllm-router
#
# SPARK_TOOL_ENV_DIR moves the environment (default: $XDG_CACHE_HOME/vllm-spark/tools, else ~/.cache/vllm-spark/tools; beside the release environments: shared by the clones on a machine).  The version is the
# one whose /get_load polling docs/deploy.md ("A fleet behind a router") describes; wheels exist for
# x86_64 and aarch64 (a DGX Spark).
set -euo pipefail
cd "$(dirname "$0")/.."

spec="vllm-router==0.1.17"
root=${SPARK_TOOL_ENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-spark/tools}
env_dir=$root/vllm-router
log=$root/vllm-router.log
mkdir -p "$root"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if [ "$(cat "$env_dir/.installed" 2>/dev/null)" != "$spec" ]; then
  bash scripts/need-disk.sh "$env_dir" 2 "router-env: $spec" || exit 1
  t0=$SECONDS
  {
    [ -x "$env_dir/bin/python" ] || "${PYTHON:-python3}" -m venv "$env_dir"
    "$env_dir/bin/pip" install "$spec"
  } >"$log" 2>&1 || { echo "router-env: installing $spec failed; last lines of $log:" >&2; tail -n 20 "$log" >&2; exit 1; }
  echo "$spec" > "$env_dir/.installed"
  echo "router-env: $spec installed in $env_dir ($((SECONDS - t0)) s)" >&2
fi
[ -x "$env_dir/bin/vllm-router" ] \
  || { echo "router-env: $env_dir/bin/vllm-router missing; delete $env_dir and run again" >&2; exit 1; }
echo "$env_dir/bin/vllm-router"
