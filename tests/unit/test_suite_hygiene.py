"""The suite runs every test it defines: a second `def test_x` in a module replaces the first, which
then never runs (it happened once: a planner gate shadowed a stronger one of the same name)."""
from __future__ import annotations

import ast
import collections
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_module_defines_a_test_twice():
    twice = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        scopes = [tree.body] + [c.body for c in tree.body if isinstance(c, ast.ClassDef)]
        for body in scopes:
            names = collections.Counter(n.name for n in body
                                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                                        and n.name.startswith("test"))
            twice += [f"{path.relative_to(TESTS)}::{name}" for name, k in names.items() if k > 1]
    assert not twice, twice
