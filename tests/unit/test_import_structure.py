"""The package's import graph, read from the source (every import, function-level ones included):
no cycle; vLLM is imported only by the two sides of the port; the outbound side imports nothing from
the plugin; domain code never imports the inbound side."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = "vllm_spark_plugin"
ROOT = Path(__file__).resolve().parents[2] / PKG
PORT_OUT, PORT_IN = f"{PKG}.vllm", f"{PKG}.hooks"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def imports(path: Path) -> set[str]:
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return out


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}
GRAPH = {m: {i for i in imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_import_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(GRAPH[m]):
            # a package's __init__ importing its own submodules is not a cycle through the package
            if under(n, m) or under(m, n) and MODULES[n].name == "__init__.py":
                continue
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def test_only_the_port_imports_vllm():
    offenders = {m: sorted(i for i in imports(p) if i == "vllm" or i.startswith("vllm."))
                 for m, p in MODULES.items() if not (under(m, PORT_OUT) or under(m, PORT_IN))}
    assert {m: v for m, v in offenders.items() if v} == {}


def test_the_outbound_side_is_a_leaf():
    for m in MODULES:
        if under(m, PORT_OUT):
            plugin = {i for i in GRAPH[m] if not under(i, PORT_OUT)}
            assert plugin == set(), f"{m} imports {sorted(plugin)}"


def test_domain_code_never_imports_the_inbound_side():
    for m in MODULES:
        if m != PKG and not under(m, PORT_IN):
            inbound = {i for i in GRAPH[m] if under(i, PORT_IN)}
            assert inbound == set(), f"{m} imports {sorted(inbound)}"


def names_from_the_root(path: Path) -> list[str]:
    """What a module takes from the package root itself (`import vllm_spark_plugin`, or a name the root
    defines); `from vllm_spark_plugin import settings` names a submodule and does not count."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name == PKG]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if base == PKG:
                out += [f"{PKG}.{a.name}" for a in node.names if f"{PKG}.{a.name}" not in MODULES]
    return out


def test_nothing_inside_the_package_imports_its_root():
    """The root is `register()` (it reaches the inbound side): shared names live in leaves
    (`_version`, `definitions`), so importing one never climbs back to the root."""
    climbers = {m: names_from_the_root(p) for m, p in MODULES.items() if m != PKG}
    assert {m: v for m, v in climbers.items() if v} == {}


def test_the_graph_was_read():
    assert f"{PKG}.hooks.stat_logger" in MODULES and f"{PKG}.metrics.exporter" in GRAPH[f"{PKG}.hooks.stat_logger"]


# --- the map (docs/architecture.md) ----------------------------------------------------------------
TOP_LEVEL = {PKG, f"{PKG}.cli", f"{PKG}.settings", f"{PKG}.definitions", f"{PKG}._version"}  # entry points and the shared owners
GROUND = {"definitions", "settings", "common", "vllm", "_version", "__init__"}  # every package may import these
# domain package -> the other domain packages it may import (the inbound side `hooks` and the command
# table `cli` may import any of them)
ALLOWED = {
    "common": set(),
    "knee": set(),
    "quant": set(),
    "metrics": {"knee"},
    "grafana": {"metrics"},
    "bench": {"knee", "metrics", "plan", "doctor"},
    "plan": {"knee"},
    "guard": {"knee"},
    "moe": {"quant"},
    "doctor": {"moe", "quant", "metrics"},
    "gpu_check": {"metrics", "moe", "quant"},
    "acceptance": {"bench", "doctor", "plan", "knee"},
    "testbed": {"bench", "knee", "metrics", "plan", "cli"},
}
ANY = {"hooks", "cli"}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_nothing_loose_at_the_top_but_the_entry_points_and_the_shared_owners():
    loose = {m for m, p in MODULES.items() if p.parent == ROOT and p.name != "__init__.py"} | {PKG}
    assert loose == TOP_LEVEL


def test_every_package_is_on_the_map_and_imports_only_what_it_may():
    packages = {package_of(m) for m, p in MODULES.items() if p.parent != ROOT}
    assert packages - ANY - {"vllm"} <= set(ALLOWED), f"not on the map: {sorted(packages - ANY - {'vllm'} - set(ALLOWED))}"
    bad = []
    for m, deps in GRAPH.items():
        a = package_of(m)
        if a in ANY or a in ("vllm", "__init__"):
            continue
        for d in deps:
            b = package_of(d)
            if b == a or b in GROUND - {a}:
                continue
            if a in ("definitions", "settings", "common", "_version") or b not in ALLOWED.get(a, set()):
                bad.append(f"{m} -> {d}")
    assert bad == []


def test_the_ground_floor_imports_nothing_above_it():
    for m in MODULES:
        a = package_of(m)
        allowed = {"definitions": set(), "_version": set(), "common": {"definitions"},
                   "settings": {"definitions", "common"}}.get(a)
        if allowed is not None:
            assert {package_of(d) for d in GRAPH[m]} - {a} <= allowed, m


def test_every_package_says_what_it_holds():
    for m, p in MODULES.items():
        if p.name == "__init__.py":
            doc = ast.get_docstring(parsed(p))
            assert doc and len(doc) > 40, f"{m}: an __init__ without a docstring saying what the package holds"


# the package faces that hold code, and why
FACES_WITH_CODE = {PKG: "register(), the vllm.general_plugins entry point named in pyproject.toml",
                   f"{PKG}.hooks": "Patch and PATCHES, the patch registry (docs/architecture.md)"}


def test_package_faces_only_re_export():
    """Code lives in a package's modules; its `__init__` says what it holds and re-exports names."""
    holding = {m for m, p in MODULES.items() if p.name == "__init__.py"
               and any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in parsed(p).body)}
    assert holding == set(FACES_WITH_CODE)


def test_only_the_inbound_side_takes_the_process_settings():
    """Domain code is handed its settings; `settings.current()` is the inbound side's to call."""
    callers = set()
    for m, p in MODULES.items():
        for node in ast.walk(parsed(p)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "current"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in ("settings", "settings_mod")):
                callers.add(m)
    assert {m for m in callers if not under(m, PORT_IN)} == set()


def test_the_architecture_page_names_every_package():
    page = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name in set(ALLOWED) | ANY | {"vllm"}:
        if (ROOT / name).is_dir():
            assert f"`{name}/`" in page, f"docs/architecture.md does not place {name}/"
