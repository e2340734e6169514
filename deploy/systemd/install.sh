#!/usr/bin/env bash
# Installs the bare-metal units on one Spark (run as root from the repository root):
#   sudo deploy/systemd/install.sh /opt/vllm/venv
# The venv must already hold a CUDA build of vLLM; the plugin is installed into it from this checkout.
set -euo pipefail
VENV=${1:-/opt/vllm/venv}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
[ -x "$VENV/bin/vllm" ] || { echo "no vLLM in $VENV (expected $VENV/bin/vllm)" >&2; exit 1; }

"$VENV/bin/pip" install "$REPO"
id vllm >/dev/null 2>&1 || useradd --system --home-dir /var/lib/vllm --create-home --shell /usr/sbin/nologin vllm
id prometheus >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin prometheus
install -d -o vllm -g vllm /var/lib/vllm
install -d /etc/vllm-spark/prometheus/rules /etc/vllm-spark/alertmanager
[ -e /etc/vllm-spark/vllm.env ] || install -m 0644 "$REPO/deploy/systemd/vllm.env" /etc/vllm-spark/vllm.env
install -m 0644 "$REPO/deploy/systemd/prometheus.yml" /etc/vllm-spark/prometheus/prometheus.yml
install -m 0644 "$REPO"/alerts/*.rules.yml /etc/vllm-spark/prometheus/rules/
install -m 0644 "$REPO/deploy/spark/alertmanager/alertmanager.yml" /etc/vllm-spark/alertmanager/alertmanager.yml
if [ "$VENV" != /opt/vllm/venv ]; then
  sed "s#/opt/vllm/venv#$VENV#g" "$REPO/deploy/systemd/vllm.service" > /etc/systemd/system/vllm.service
else
  install -m 0644 "$REPO/deploy/systemd/vllm.service" /etc/systemd/system/vllm.service
fi
install -m 0644 "$REPO/deploy/systemd/vllm-spark-prometheus.service" /etc/systemd/system/
install -m 0644 "$REPO/deploy/systemd/vllm-spark-alertmanager.service" /etc/systemd/system/
promtool check config /etc/vllm-spark/prometheus/prometheus.yml
amtool check-config /etc/vllm-spark/alertmanager/alertmanager.yml
systemctl daemon-reload
systemctl disable --now prometheus.service prometheus-alertmanager.service 2>/dev/null || true
systemctl enable --now vllm.service vllm-spark-prometheus.service vllm-spark-alertmanager.service
echo "started; follow with: journalctl -fu vllm"
