"""`hooks.PATCHES` is what installs the patches, and lists every wrap site.

Read from the source (no vLLM needed): every `patching.replace(NAME, ...)` names a registered patch
and every registered wrap has at least one; no other code in the package replaces an attribute of a
class or a dunder (`setattr`, `X.attr = ...` with X a class name, `obj.__call__ = ...`), so a wrap site
cannot exist outside the registry.  Each entry's install function exists and takes the registry's
arguments; registration installs by iterating the registry.
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

from vllm_spark_plugin.hooks import BY_VLLM, EVERY, PATCHES, PLUGIN_LOAD, STAT_LOGGER

PKG = Path(__file__).resolve().parents[2] / "vllm_spark_plugin"
PATCHING = PKG / "hooks" / "patching.py"
FUNCTION_METADATA = {"__name__", "__qualname__", "__doc__", "__module__", "__wrapped__"}  # a wrapper's own


def _sources():
    for path in sorted(PKG.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def replace_calls() -> dict[str, list[str]]:
    """patch name -> 'file:line' of each `patching.replace("name", ...)`."""
    found: dict[str, list[str]] = {}
    for path, tree in _sources():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "replace"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "patching"):
                arg = node.args[0] if node.args else None
                name = arg.value if isinstance(arg, ast.Constant) else _module_constant(tree, arg)
                found.setdefault(str(name), []).append(f"{path.relative_to(PKG)}:{node.lineno}")
    return found


def _module_constant(tree, arg):
    """`PATCH` -> its string, for `PATCH = "name"` at the module's top."""
    if isinstance(arg, ast.Name):
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == arg.id for t in node.targets):
                if isinstance(node.value, ast.Constant):
                    return node.value.value
    return None


def unlisted_wrap_sites() -> list[str]:
    """Attribute replacements that do not go through `patching.replace`."""
    out = []
    for path, tree in _sources():
        if path == PATCHING:
            continue
        for node in ast.walk(tree):
            where = f"{path.relative_to(PKG)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                target = node.args[0] if node.args else None
                if isinstance(target, ast.Name) and target.id[:1].isupper():
                    out.append(f"{where}: setattr on {target.id}")
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if not isinstance(t, ast.Attribute):
                        continue
                    base = t.value.id if isinstance(t.value, ast.Name) else ""
                    dunder = t.attr.startswith("__") and t.attr.endswith("__") and t.attr not in FUNCTION_METADATA
                    if base[:1].isupper() or dunder:
                        out.append(f"{where}: {base or '<expr>'}.{t.attr} = ...")
    return out


def test_every_wrap_site_is_registered_and_every_registered_wrap_has_one():
    calls = replace_calls()
    wraps = {p.name for p in PATCHES if p.kind == "wrap"}
    assert set(calls) == wraps, {"unregistered": sorted(set(calls) - wraps), "never installed": sorted(wraps - set(calls))}


def test_no_attribute_of_a_class_is_replaced_outside_patching():
    assert unlisted_wrap_sites() == []


def test_the_site_scanner_finds_a_direct_monkeypatch(tmp_path, monkeypatch):
    """The scanner is not blind: a direct class patch in a module of the package is reported."""
    import test_patch_registry as me
    sneaky = tmp_path / "vllm_spark_plugin"
    sneaky.mkdir()
    (sneaky / "sneaky.py").write_text("def f(Scheduler, app, fn):\n    Scheduler.schedule = fn\n"
                                      "    app.__call__ = fn\n    setattr(Scheduler, 'x', fn)\n")
    monkeypatch.setattr(me, "PKG", sneaky)
    assert len(me.unlisted_wrap_sites()) == 3


def test_each_entry_says_how_it_is_installed():
    for p in PATCHES:
        assert p.phase in (PLUGIN_LOAD, STAT_LOGGER, BY_VLLM), p.name
        assert p.processes and all(isinstance(x, str) for x in p.processes), p.name
        if p.phase == BY_VLLM:
            assert p.install == "", f"{p.name}: vLLM itself installs it"
            continue
        module, _, fn = p.install.partition(":")
        path = PKG.parent / (module.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert fn in defs, f"{p.name}: {p.install} does not exist"
        args = [a.arg for a in defs[fn].args.args][:3]
        assert args == ["patch", "settings", "on_error"], f"{p.name}: {fn}{tuple(args)}"
        assert defs[fn].args.kwarg is not None, f"{p.name}: {fn} must take the phase's **context"
        if p.setting:
            from vllm_spark_plugin.settings import Settings
            assert isinstance(getattr(Settings(), p.setting), bool), p.name
        assert EVERY in p.processes or p.processes


def test_registration_installs_by_iterating_the_registry():
    from vllm_spark_plugin.hooks import registration
    src = inspect.getsource(registration.install)
    assert "for patch in PATCHES" in src
    body = ast.parse(inspect.getsource(registration.register_all).strip())
    imported = {a.name for n in ast.walk(body) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    for p in PATCHES:
        module = p.install.partition(":")[0].rpartition(".")[2]
        assert not p.install or module == "registration" or module not in imported, \
            f"{p.name} is wired by hand in register_all"
