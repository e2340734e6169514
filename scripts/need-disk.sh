#!/usr/bin/env bash
# need-disk.sh DIR GB WHAT: exit 1, naming the shortfall, when DIR's filesystem (or pip's temporary
# directory's) has under GB gigabytes free.  Run before an install that would otherwise stop halfway
# with pip's "[Errno 28] No space left on device" and leave a broken environment behind.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 DIR GB WHAT" >&2; exit 2; }
dir=$1 gb=$2 what=$3
mkdir -p "$dir"
for d in "$dir" "${TMPDIR:-/tmp}"; do
  free=$(df -Pk "$d" | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }')
  if awk -v f="$free" -v g="$gb" 'BEGIN { exit !(f < g) }'; then
    echo "$what needs about $gb GB free; $d has $free GB free (df -h $d): free some space and run again" >&2
    exit 1
  fi
done
