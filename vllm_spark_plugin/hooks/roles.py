"""Which vLLM process this is (for logs, and for what each process does at registration)."""
from __future__ import annotations

import multiprocessing


def process_role() -> str:
    """'engine_core', 'worker', 'api_server' (the main process), or the process's own name."""
    name = multiprocessing.current_process().name
    if name.startswith("EngineCore"):
        return "engine_core"
    if "worker" in name.lower():
        return "worker"
    return "api_server" if name == "MainProcess" else name
