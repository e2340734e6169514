"""Streaming safetensors I/O: read one tensor at a time, write size-capped shards.

`TensorReader` keeps one `safe_open` handle per file but drops and reopens them after a byte
budget, so the file pages it touched leave the process's resident set: memory stays bounded by the
tensors in flight plus one output shard, whatever the checkpoint size.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class CheckpointLayoutError(ValueError):
    """The checkpoint's files are missing or inconsistent (names the file)."""


def weight_files(folder: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file holding it.

    Uses `model.safetensors.index.json` when present (and checks each listed file exists), else
    every `*.safetensors` file in the folder.
    """
    from safetensors import safe_open

    folder = Path(folder)
    index = folder / INDEX_NAME
    out: dict[str, Path] = {}
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise CheckpointLayoutError(f"{index}: not a safetensors index ({exc})") from None
        for name, fname in weight_map.items():
            path = folder / fname
            if not path.exists():
                raise CheckpointLayoutError(f"{index}: tensor {name} is mapped to {fname}, which does not exist")
            out[name] = path
        return out
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointLayoutError(f"{folder}: no *.safetensors files (and no {INDEX_NAME})")
    for path in files:
        with safe_open(str(path), "pt") as fh:
            for name in fh.keys():
                if name in out:
                    raise CheckpointLayoutError(f"tensor {name} is stored twice: {out[name].name} and {path.name}")
                out[name] = path
    return out


@dataclass
class TensorInfo:
    name: str
    path: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype string: BF16, F32, U8, F8_E4M3, ...


def header(path: Path) -> dict[str, dict]:
    """The safetensors JSON header of one file (tensor name -> {dtype, shape, data_offsets})."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if n <= 0 or n > 1 << 30:
            raise CheckpointLayoutError(f"{path}: not a safetensors file (header length {n})")
        hdr = json.loads(fh.read(n))
    hdr.pop("__metadata__", None)
    return hdr


def tensor_infos(folder: Path) -> dict[str, TensorInfo]:
    """Names, shapes and dtypes of every tensor, from the headers only (no tensor data read)."""
    files = weight_files(folder)
    headers: dict[Path, dict] = {}
    out: dict[str, TensorInfo] = {}
    for name, path in files.items():
        if path not in headers:
            headers[path] = header(path)
        meta = headers[path].get(name)
        if meta is None:
            raise CheckpointLayoutError(f"{path.name}: tensor {name} is listed in the index but not in the file")
        out[name] = TensorInfo(name, path, tuple(meta["shape"]), meta["dtype"])
    return out


class TensorReader:
    """Read tensors by name, one at a time, with a bounded mapped-file footprint."""

    def __init__(self, files: dict[str, Path], reopen_bytes: int = 64 << 20) -> None:
        self.files = files
        self.reopen_bytes = reopen_bytes
        self._handles: dict[Path, object] = {}
        self._since_reopen = 0
        self.bytes_read = 0

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        path = self.files[name]
        fh = self._handles.get(path)
        if fh is None:
            fh = self._handles[path] = safe_open(str(path), "pt")
        t = fh.get_tensor(name)
        n = t.numel() * t.element_size()
        self.bytes_read += n
        self._since_reopen += n
        if self._since_reopen >= self.reopen_bytes:
            self.close()  # unmaps: pages read so far stop counting toward our resident set
        return t

    def close(self) -> None:
        self._handles.clear()
        self._since_reopen = 0


@dataclass
class ShardWriter:
    """Accumulate tensors and write `model-0000i-of-0000n.safetensors` shards of <= max_bytes."""

    folder: Path
    max_bytes: int = 2 << 30
    _pending: dict = field(default_factory=dict)
    _pending_bytes: int = 0
    _written: list = field(default_factory=list)  # (tmp path, [names])
    total_bytes: int = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        n = tensor.numel() * tensor.element_size()
        if self._pending and self._pending_bytes + n > self.max_bytes:
            self._flush()
        self._pending[name] = tensor.contiguous()
        self._pending_bytes += n
        self.total_bytes += n

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if not self._pending:
            return
        tmp = Path(self.folder) / f".shard-{len(self._written):05d}.safetensors.partial"
        save_file(self._pending, str(tmp), metadata={"format": "pt"})
        self._written.append((tmp, list(self._pending)))
        self._pending = {}
        self._pending_bytes = 0

    def finish(self) -> list[Path]:
        """Write the last shard, give the shards their final names and write the index."""
        self._flush()
        n = len(self._written)
        final: list[Path] = []
        weight_map: dict[str, str] = {}
        for i, (tmp, names) in enumerate(self._written, start=1):
            fname = SINGLE_NAME if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors"
            dst = Path(self.folder) / fname
            os.replace(tmp, dst)
            final.append(dst)
            for name in names:
                weight_map[name] = fname
        if n > 1:
            index = {"metadata": {"total_size": self.total_bytes},
                     "weight_map": dict(sorted(weight_map.items()))}
            (Path(self.folder) / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        return final


def iter_names(files: dict[str, Path]) -> Iterator[str]:
    """Tensor names grouped by file, in file order (sequential reads)."""
    by_file: dict[Path, list[str]] = {}
    for name, path in files.items():
        by_file.setdefault(path, []).append(name)
    for path in sorted(by_file):
        yield from sorted(by_file[path])
