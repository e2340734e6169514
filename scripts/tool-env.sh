#!/usr/bin/env bash
# A virtual environment of its own for one third-party sweep tool (idempotent), so its pins never
# touch .venv's vLLM.  Prints the environment's bin/ folder on stdout; pip's output goes to the log.
#
#   bash scripts/tool-env.sh aiperf       NVIDIA AIPerf     -> ~/.cache/vllm-spark/tools/aiperf/bin/aiperf
#   bash scripts/tool-env.sh guidellm     GuideLLM          -> ~/.cache/vllm-spark/tools/guidellm/bin/guidellm
#
# SPARK_TOOL_ENV_DIR moves the environments (default: $XDG_CACHE_HOME/vllm-spark/tools, else ~/.cache/vllm-spark/tools; beside the release environments: shared by the clones on a machine).  The versions are
# the ones whose exports knee/loaders.py was written against (docs/bench.md).
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  aiperf) spec="aiperf==0.13.0" ;;
  guidellm) spec="guidellm==0.8.1" ;;
  *) echo "usage: bash scripts/tool-env.sh aiperf|guidellm" >&2; exit 2 ;;
esac
name=$1
root=${SPARK_TOOL_ENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-spark/tools}
env_dir=$root/$name
mkdir -p "$root"
log=$root/$name.log
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if [ "$(cat "$env_dir/.installed" 2>/dev/null)" != "$spec" ]; then
  bash scripts/need-disk.sh "$env_dir" 2 "tool-env: $spec" || exit 1
  t0=$SECONDS
  {
    [ -x "$env_dir/bin/python" ] || "${PYTHON:-python3}" -m venv "$env_dir"
    # GuideLLM requires torch (any build): reuse .venv's CPU build when it has one, or pip fetches
    # the CUDA build and its libraries (several GB) for a tool that never runs a model.
    cpu_torch=$(.venv/bin/python -c 'import importlib.metadata as m; v = m.version("torch"); print(v if "+cpu" in v else "")' 2>/dev/null || true)
    if [ "$name" = guidellm ] && [ -n "$cpu_torch" ]; then "$env_dir/bin/pip" install "torch==$cpu_torch"; fi
    "$env_dir/bin/pip" install "$spec"
  } >"$log" 2>&1 || { echo "tool-env: installing $spec failed; last lines of $log:" >&2; tail -n 20 "$log" >&2; exit 1; }
  echo "$spec" > "$env_dir/.installed"
  echo "tool-env: $spec installed in $env_dir ($((SECONDS - t0)) s)" >&2
fi
[ -x "$env_dir/bin/$name" ] || { echo "tool-env: $env_dir/bin/$name missing after installing $spec" >&2; exit 1; }
echo "$env_dir/bin"
