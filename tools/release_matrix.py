"""The release x feature table from the JUnit files of `scripts/release-matrix.sh`.

    python tools/release_matrix.py runs/release-matrix

Each feature is the set of tests that prove it; a release passes a feature when every one of those
tests ran and passed.  Writes matrix.md and matrix.json next to the inputs and prints the table.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# feature -> substrings of the test ids (file::name) that prove it
FEATURES = {
    "port contract": ["test_vllm_port.py::"],
    "batch size": ["test_batch_size_histogram_reaches_concurrency"],
    "composition + step time": ["test_step_duration_and_tokens_recorded"],
    "KV blocks": ["test_kv_blocks"],
    "TTFT + finished": ["test_ttft_and_stream_rate_counts"],
    "per-stream rate": ["test_every_stream_is_rated_on_both_clocks"],
    "tokens = usage": ["test_generation_tokens_equal_usage"],
    "live knee": ["test_live_knee_has_a_verdict_and_a_finite_fit"],
    "no errors": ["test_info_and_no_errors"],
    "NVFP4 config + MoE": ["test_nvfp4_serve.py::"],
}


def read(path: Path) -> dict[str, str]:
    """test id -> passed / failed / skipped"""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name')}"
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed"
            elif child.tag == "skipped":
                status = "skipped"
        out[tid] = status
    return out


def version_key(v: str):
    return tuple(int(x) if x.isdigit() else x for x in v.split("."))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    d = Path(argv[0] if argv else "runs/release-matrix")
    versions = sorted({p.name.split("-")[0] for p in d.glob("*-*.xml")} | {p.stem for p in d.glob("*.unavailable")},
                      key=version_key)
    table, failed = {}, False
    for v in versions:
        row = {}
        if (d / f"{v}.unavailable").exists():
            row = {f: "n/a" for f in FEATURES}
            row["note"] = (d / f"{v}.unavailable").read_text().strip()
        else:
            results = {}
            for p in d.glob(f"{v}-*.xml"):
                results.update(read(p))
            for feature, keys in FEATURES.items():
                got = [s for tid, s in results.items() if any(k in tid for k in keys)]
                row[feature] = "-" if not got else ("yes" if all(s == "passed" for s in got) else "NO")
                failed |= row[feature] == "NO"
            row["note"] = "served + contract" if (d / f"{v}-serve.xml").exists() else "contract (classes and signatures)"
        table[v] = row
    cols = list(FEATURES) + ["note"]
    lines = ["| vLLM | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += [f"| {v} | " + " | ".join(row[c] for c in cols) + " |" for v, row in table.items()]
    text = "\n".join(lines) + "\n\n`-`: not checked for this release (no CPU build: classes and signatures only).\n"
    (d / "matrix.md").write_text(text)
    (d / "matrix.json").write_text(json.dumps(table, indent=2) + "\n")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
