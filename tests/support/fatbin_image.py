"""Build small ELF images with a `.nv_fatbin` section, laid out as vLLM's CUDA wheels lay theirs out
(vllm_spark_plugin/doctor/fatbin.py), for seeding a library whose FP4 kernels target the wrong SM."""
from __future__ import annotations

import struct

from vllm_spark_plugin.doctor import fatbin


def elf(sections: dict[str, bytes], symbols: list[tuple[str, int]] = ()) -> bytes:
    """A minimal ELF64 little-endian image with the given sections (and a .symtab/.strtab holding
    `symbols` as (name, st_info) when given)."""
    sections = dict(sections)
    if symbols:
        strtab = b"\0"
        symtab = b"\0" * 24
        for name, info in symbols:
            symtab += struct.pack("<IBBHQQ", len(strtab), info, 0, 0, 0, 0)
            strtab += name.encode() + b"\0"
        sections[".symtab"], sections[".strtab"] = symtab, strtab
    names = [""] + list(sections) + [".shstrtab"]
    shstrtab = b"".join(n.encode() + b"\0" for n in names)
    name_off = {}
    off = 0
    for n in names:
        name_off[n] = off
        off += len(n) + 1
    body = b""
    placed = []
    pos = 64
    for n in names[1:-1]:
        data = sections[n]
        placed.append((n, pos, len(data)))
        body += data
        pos += len(data)
    placed.append((".shstrtab", pos, len(shstrtab)))
    body += shstrtab
    pos += len(shstrtab)
    shoff = pos
    headers = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    for n, at, size in placed:
        headers += struct.pack("<IIQQQQIIQQ", name_off[n], 1, 0, 0, at, size, 0, 0, 1, 0)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x33, 8]) + b"\0" * 7
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(names), len(names) - 1)
    return header + body + headers


def cubin(kernels: list[str]) -> bytes:
    return elf({".text": b"\0" * 16}, [(k, 0x12) for k in kernels])  # STB_GLOBAL | STT_FUNC


def entry(sm: int, variant: str, kernels: list[str], kind: int = fatbin.KIND_CUBIN) -> bytes:
    """One uncompressed fat-binary entry (64-byte header, as the older toolchains write it)."""
    payload = cubin(kernels) if kind == fatbin.KIND_CUBIN else "".join(
        f".visible .entry {k}()\n{{\n}}\n" for k in kernels).encode()
    padded = payload + b"\0" * (-len(payload) % 8)
    flags = 0x11 | {"": 0, "a": fatbin.FLAG_ARCH_SPECIFIC, "f": fatbin.FLAG_FAMILY}[variant]
    header = struct.pack("<HHIQIIIIIIQQQ", kind, 0x101, 64, len(padded), len(payload), 0, 0x10008, sm, 0, 0,
                         flags, 0, len(payload))
    assert len(header) == 64
    return header + padded


def library(entries: list[bytes], host_strings: bytes = b"scaled_fp4_quant\0") -> bytes:
    """A shared library image whose `.nv_fatbin` holds one container with `entries`."""
    body = b"".join(entries)
    container = struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body
    return elf({".rodata": host_strings, ".nv_fatbin": container})
