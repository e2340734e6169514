"""A check's verdict, and the report: `gpu-check.json` and `gpu-check.txt`, rewritten after every
check so that a run stopped half way (a hang, the hard time limit) still leaves what it measured.

Exit codes of the command: 0 no check failed, 1 a check failed (or the run did not complete),
2 usage.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASS, FAIL, NA = "pass", "fail", "n/a"
STATUSES = (PASS, FAIL, NA)
FORMAT = "vllm-spark-gpu-check/1"
JSON_NAME, TEXT_NAME = "gpu-check.json", "gpu-check.txt"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class NotApplicable(Exception):
    """Raised by a check that does not apply on this machine; the message says why."""


@dataclass
class Verdict:
    """What a check function returns."""

    status: str
    detail: str
    figures: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {', '.join(STATUSES)}")


def verdict(ok: bool, detail: str, **figures) -> Verdict:
    return Verdict(PASS if ok else FAIL, detail, figures)


@dataclass
class Result:
    """One check as the report holds it."""

    name: str
    status: str
    detail: str
    figures: dict = field(default_factory=dict)
    seconds: float = 0.0
    dry: bool = False


def clean(obj):
    """JSON-safe copy: non-finite floats become None, tuples lists, unknown objects their str()."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return str(obj)


def iso_utc(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


class Report:
    """The results so far, flushed to `out_dir` after each one."""

    def __init__(self, out_dir: str | Path, mode: str, machine: dict | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.mode = mode
        self.machine: dict = dict(machine or {})
        self.results: list[Result] = []
        self.started = time.time()
        self.finished: float | None = None

    def add(self, result: Result) -> None:
        self.results.append(result)
        self.flush()

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    def exit_code(self) -> int:
        failed = self.counts()[FAIL] > 0
        return EXIT_FAILED if failed or self.finished is None else EXIT_OK

    def to_json(self) -> dict:
        return clean({
            "format": FORMAT, "mode": self.mode, "complete": self.finished is not None,
            "started": iso_utc(self.started),
            "finished": None if self.finished is None else iso_utc(self.finished),
            "seconds": round((self.finished or time.time()) - self.started, 1),
            "machine": self.machine, "summary": self.counts(),
            "checks": [asdict(r) for r in self.results],
        })

    def to_text(self) -> str:
        m = self.machine
        lines = [f"vllm-spark gpu-check ({self.mode}) {iso_utc(self.started)}",
                 f"machine: unknown ({m['error']})" if "error" in m else
                 f"machine: {m.get('gpu_name', 'unknown')} (compute capability {m.get('compute_capability', '?')}), "
                 f"driver {m.get('driver_version', '?')}, CUDA {m.get('cuda_driver_version', '?')}, "
                 f"torch {m.get('torch_version', '?')} (CUDA {m.get('torch_cuda', '?')}), host {m.get('hostname', '?')}"]
        width = max((len(r.name) for r in self.results), default=0)
        for r in self.results:
            lines.append(f"[{r.status:>4}] {r.name:<{width}}  {r.detail}  ({r.seconds:.1f} s)")
        c = self.counts()
        end = "" if self.finished is not None else "; INCOMPLETE: the run stopped before its last check"
        lines.append(f"{len(self.results)} checks: {c[PASS]} passed, {c[FAIL]} failed, "
                     f"{c[NA]} not applicable ({(self.finished or time.time()) - self.started:.0f} s){end}")
        return "\n".join(lines) + "\n"

    def flush(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        _write(self.out_dir / JSON_NAME, json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")
        _write(self.out_dir / TEXT_NAME, self.to_text())

    def finish(self) -> int:
        self.finished = time.time()
        self.flush()
        return self.exit_code()


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
