#!/usr/bin/env python3
"""Write the central Prometheus' file_sd target list for N Sparks.

    python3 deploy/fleet/make_targets.py spark-1:8000 spark-2:8000            # -> prometheus/targets/vllm.json
    python3 deploy/fleet/make_targets.py --kind federate spark-1:9090 spark-2:9090
    python3 deploy/fleet/make_targets.py --from-file hosts.txt --port 8000    # one host per line
    python3 deploy/fleet/make_targets.py --kind router router-host:29000     # vllm-router's metrics port

Each target gets a `spark` label (its host name) so alerts and dashboards can name the box.
Prometheus re-reads the file within a minute; no restart needed.  Standard library only.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HOSTPORT = re.compile(r"^(?P<host>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:]+\])(:(?P<port>\d{1,5}))?$")
DEFAULT_PORT = {"vllm": 8000, "federate": 9090, "router": 29000}


def targets_document(hosts: list[str], kind: str, port: int | None) -> list[dict]:
    groups = []
    seen = set()
    for raw in hosts:
        h = raw.strip()
        if not h or h.startswith("#"):
            continue
        m = HOSTPORT.match(h)
        if not m:
            raise ValueError(f"not a host or host:port: {raw!r}")
        p = int(m.group("port") or port or DEFAULT_PORT[kind])
        if not 0 < p < 65536:
            raise ValueError(f"port out of range in {raw!r}")
        target = f"{m.group('host')}:{p}"
        if target in seen:
            raise ValueError(f"duplicate target {target}")
        seen.add(target)
        groups.append({"targets": [target], "labels": {"spark": m.group("host").strip("[]")}})
    if not groups:
        raise ValueError("no hosts given")
    return groups


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("hosts", nargs="*", help="host or host:port of each Spark")
    ap.add_argument("--kind", choices=sorted(DEFAULT_PORT), default="vllm",
                    help="vllm: scrape vLLM directly; federate: scrape node Prometheus /federate; "
                         "router: scrape vllm-router's --prometheus-port")
    ap.add_argument("--port", type=int, help="port for hosts given without one")
    ap.add_argument("--from-file", type=Path, help="read hosts from a file, one per line")
    ap.add_argument("--out", type=Path, help="output file (default: prometheus/targets/<kind>.json here)")
    args = ap.parse_args(argv)
    hosts = list(args.hosts)
    if args.from_file:
        hosts += args.from_file.read_text().splitlines()
    try:
        doc = targets_document(hosts, args.kind, args.port)
    except ValueError as exc:
        print(f"make_targets: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(__file__).resolve().parent / "prometheus" / "targets" / f"{args.kind}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}: {len(doc)} target(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
