"""Point vLLM's Triton fused MoE at tuned GB10 configs without hiding the user's own.

vLLM reads ONE folder, `VLLM_TUNED_CONFIG_FOLDER`, before its built-in configs (fused_moe.py
`get_moe_configs`; the LoRA and Mamba kernels read the same folder).  The plugin's sources are

1. the user's `VLLM_TUNED_CONFIG_FOLDER` (always first: a file there wins),
2. `~/.cache/vllm-spark/moe-configs` (what `vllm-spark tune-moe` writes),
3. the packaged `vllm_spark_plugin/moe/configs/` (configs measured on a GB10 by a public source).

When 2 and 3 hold no `*.json`, nothing changes.  When the user has no folder and only one source
has configs, vLLM is pointed straight at it.  Otherwise the plugin builds a merged folder of
symlinks (`$TMPDIR/vllm-spark-plugin/tuned-configs-<hash>/`: every entry of the user's folder,
then the plugin's files whose names the user's folder lacks) and points vLLM there.  The variable
is set in the API-server process before vLLM spawns its engine, so every process inherits it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

log = logging.getLogger("vllm_spark_plugin")

ENV = "VLLM_TUNED_CONFIG_FOLDER"
PACKAGED_DIR = Path(__file__).resolve().parent / "configs"
USER_TUNED_DIR = Path.home() / ".cache" / "vllm-spark" / "moe-configs"
MARKER = ".vllm-spark-merged.json"


def config_files(folder: Path | None) -> list[Path]:
    if folder is None or not Path(folder).is_dir():
        return []
    return sorted(p for p in Path(folder).glob("*.json") if p.is_file())


def is_merged(folder: str | Path | None) -> bool:
    return bool(folder) and (Path(folder) / MARKER).exists()


def plan(user_folder: str | None, sources: list[Path]) -> tuple[str | None, dict[str, Path]]:
    """(folder vLLM should read, {file name: source path} of the plugin files it adds).
    Returns (user_folder, {}) when the plugin has nothing to add."""
    added: dict[str, Path] = {}
    for src in sources:
        for p in config_files(src):
            added.setdefault(p.name, p)  # earlier sources win
    if not added:
        return user_folder, {}
    user = Path(user_folder) if user_folder else None
    user_names = {p.name for p in user.iterdir()} if user and user.is_dir() else set()
    added = {n: p for n, p in added.items() if n not in user_names}
    if not added:
        return user_folder, {}
    if user is None:
        folders = {p.parent for p in added.values()}
        if len(folders) == 1:
            only = folders.pop()
            if {p.name for p in config_files(only)} == set(added):
                return str(only), added
    return None, added  # a merged folder is needed


def build_merged(user_folder: str | None, added: dict[str, Path], base: Path | None = None) -> Path:
    """Create (or reuse) the merged folder of symlinks; copies where symlinks are not allowed."""
    user = Path(user_folder).resolve() if user_folder else None
    entries: dict[str, Path] = {}
    if user is not None and user.is_dir():
        for p in sorted(user.iterdir()):
            entries[p.name] = p
    for name, p in added.items():
        entries.setdefault(name, p.resolve())
    digest = hashlib.sha256(json.dumps(
        {n: [str(p), p.stat().st_mtime_ns if p.exists() else 0] for n, p in sorted(entries.items())}
    ).encode()).hexdigest()[:16]
    base = base or Path(tempfile.gettempdir()) / "vllm-spark-plugin"
    folder = base / f"tuned-configs-{digest}"
    if is_merged(folder):
        return folder
    tmp = base / f".tuned-configs-{digest}.{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for name, p in entries.items():
        try:
            (tmp / name).symlink_to(p)
        except OSError:
            if p.is_dir():
                shutil.copytree(p, tmp / name)
            else:
                shutil.copy2(p, tmp / name)
    (tmp / MARKER).write_text(json.dumps({"user_folder": str(user) if user else None,
                                          "entries": {n: str(p) for n, p in entries.items()}}, indent=2))
    try:
        os.replace(tmp, folder)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def apply(environ: MutableMapping[str, str] | None = None,
          sources: list[Path] | None = None) -> str | None:
    """Set VLLM_TUNED_CONFIG_FOLDER as described above; returns the folder vLLM will read."""
    env = os.environ if environ is None else environ
    current = env.get(ENV) or None
    if is_merged(current):
        return current  # inherited from the API-server process
    sources = [USER_TUNED_DIR, PACKAGED_DIR] if sources is None else sources
    folder, added = plan(current, sources)
    if not added:
        return current
    if folder is None:
        folder = str(build_merged(current, added))
    env[ENV] = folder
    log.info("vllm-spark-plugin: %s=%s (%d tuned MoE config(s) added%s)", ENV, folder, len(added),
             f" after the user's {current}" if current else "")
    return folder
