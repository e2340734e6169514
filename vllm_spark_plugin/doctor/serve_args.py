"""The `vllm serve` arguments doctor judges: the flags it cares about, picked out of the argument list
the user plans to serve with (given after `--`)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServeArgs:
    model: str | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = False
    moe_backend: str | None = None
    argv: list[str] = field(default_factory=list)  # the serve arguments as given (doctor_memory reads more flags)


def parse_serve_args(argv: list[str]) -> ServeArgs:
    """Pick the flags doctor cares about out of a `vllm serve ...` argument list."""
    out = ServeArgs()
    args = [a for a in argv if a != "--"]
    if args and args[0] == "vllm":
        args = args[1:]
    if args and args[0] == "serve":
        args = args[1:]
    i = 0
    positional: list[str] = []
    while i < len(args):
        a = args[i]
        key, eq, val = a.partition("=")
        needs_value = key in ("--gpu-memory-utilization", "--model", "--moe-backend")
        if needs_value and not eq:
            val = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        if key == "--gpu-memory-utilization":
            try:
                out.gpu_memory_utilization = float(val)
            except ValueError:
                raise ValueError(f"--gpu-memory-utilization {val!r} is not a number") from None
        elif key == "--model":
            out.model = val
        elif key == "--moe-backend":
            out.moe_backend = val
        elif key in ("--enforce-eager", "-O0") or a in ("--compilation-config.cudagraph_mode=NONE",):
            out.enforce_eager = True
        elif key == "--no-enforce-eager":
            out.enforce_eager = False
        elif not a.startswith("-"):
            positional.append(a)
        i += 1
    if out.model is None and positional:
        out.model = positional[0]
    out.argv = args
    return out
