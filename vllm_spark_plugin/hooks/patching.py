"""The one way the plugin replaces an attribute of vLLM (or of the server framework vLLM runs on):
`replace(patch, owner, attr, new)`, naming the `hooks.PATCHES` entry it belongs to, so that no wrap
site can exist unlisted (`tests/unit/test_patch_registry.py` reads every call).  `mark`/`marked`
keep a class from being wrapped twice when a module is reloaded or a hook installed again.
"""
from __future__ import annotations


def replace(patch: str, owner, attr: str, new):
    """`owner.attr = new` for the registered patch `patch`; returns the original.  `new.__wrapped__`
    points at the original (probes and `inspect` read vLLM's own signature through it)."""
    from vllm_spark_plugin.hooks import PATCH_NAMES
    if patch not in PATCH_NAMES:
        raise KeyError(f"{patch!r} is not in hooks.PATCHES: register the patch before installing it")
    original = getattr(owner, attr)
    if getattr(new, "__wrapped__", None) is None:
        new.__wrapped__ = original
    setattr(owner, attr, new)
    return original


def _marker(patch: str) -> str:
    return f"_vllm_spark_{patch}"


def mark(owner, patch: str) -> None:
    setattr(owner, _marker(patch), True)


def marked(owner, patch: str) -> bool:
    """True when `patch` was installed on this very class (not inherited from a patched base)."""
    return bool(vars(owner).get(_marker(patch), False))
