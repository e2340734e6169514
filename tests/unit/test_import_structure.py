"""The package's import graph, read from the source (every import, function-level ones included):
no cycle; vLLM is imported only by the two sides of the port; the outbound side imports nothing from
the plugin; domain code never imports the inbound side."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = "vllm_spark_plugin"
ROOT = Path(__file__).resolve().parents[2] / PKG
PORT_OUT, PORT_IN = f"{PKG}.vllm", f"{PKG}.hooks"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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


def test_the_graph_was_read():
    assert f"{PKG}.hooks.stat_logger" in MODULES and f"{PKG}.metrics.exporter" in GRAPH[f"{PKG}.hooks.stat_logger"]
