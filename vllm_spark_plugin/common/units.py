"""Sizes as people type them on a command line (`2GB`, `512MiB`, `1.5G`, `1000000`).

On the ground floor because its callers cannot share otherwise: the NVFP4 converter imports torch,
which the doctor's link probe must not pull in, and neither package may import the other's commands.
"""
from __future__ import annotations

import re

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*", re.IGNORECASE)
_MULTIPLES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, examples: str = "1G, 512M") -> int:
    """Bytes from `1G`, `512MiB`, `1.5GB`, `1000000`: K, M, G, T are binary multiples, B and iB alike.

    Zero is a size: each caller sets its own range.  The ValueError names `examples` of the caller's
    option (its default's spelling), so the hint reads like the option it is for."""
    m = _SIZE.fullmatch(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. {examples})")
    return int(float(m.group(1)) * _MULTIPLES[m.group(2).upper()])
