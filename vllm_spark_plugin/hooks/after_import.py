"""Run a patch when vLLM imports a module: now if it is imported already, else right after.

The hooks are installed in every process at plugin load, before vLLM imports most of itself; waiting
for the module's import spares the processes that never import it (the scheduler lives only in the
engine core) the import, and patches the class before anything can use it.
"""
from __future__ import annotations

import sys


class AfterImport:
    """A meta-path finder that runs `fn(module)` right after `name` is imported."""

    def __init__(self, name: str, fn, key: str = "") -> None:
        self.name = name
        self.fns = {key: fn}  # every patch waiting for this module, by key

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module, fns = spec.loader.exec_module, self.fns

        def exec_and_patch(module):
            exec_module(module)
            for fn in list(fns.values()):
                fn(module)
        spec.loader.exec_module = exec_and_patch
        return spec


def when_imported(name: str, fn, key: str = "") -> None:
    """`fn(module)` once `name` is imported; one watcher per module name and one call per `key`,
    however often installed (several patches wait for one module under their own keys)."""
    module = sys.modules.get(name)
    if module is not None:
        fn(module)
        return
    watcher = next((f for f in sys.meta_path if isinstance(f, AfterImport) and f.name == name), None)
    if watcher is None:
        sys.meta_path.insert(0, AfterImport(name, fn, key))
    else:
        watcher.fns.setdefault(key, fn)


def patch_when_imported(name: str, probe: str, patch, on_error, where: str, off: str) -> None:
    """Once `name` is imported: `patch(module)` if the capability probe `probe` passes, else one
    warning `off: <reason>`; an exception is counted under `where`, never raised into vLLM."""
    import logging

    def run(module):
        try:
            from vllm_spark_plugin.vllm import capabilities
            cap = getattr(capabilities, probe)()  # looked up now: tests replace probes
            if not cap.ok:
                logging.getLogger("vllm_spark_plugin").warning("vllm-spark-plugin: %s: %s", off, cap.reason)
                return
            patch(module)
        except Exception as exc:
            on_error(where, exc)

    when_imported(name, run, where)
