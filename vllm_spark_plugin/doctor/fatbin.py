"""Which GPU architectures a compiled CUDA library carries code for, read from the file itself.

A CUDA extension (vLLM's `_C`, `_moe_C`, ...) keeps its device code in the ELF section `.nv_fatbin`:
a run of fat-binary containers (magic 0xBA55ED50), each a list of entries, one per target: a cubin
(machine code for one SM) or PTX (compiled by the driver at load).  Each entry header names its SM
(offset 28) and flags (offset 40): bit 0x8000 says the payload is zstd-compressed, 0x100000 marks an
arch-specific target (`sm_90a`: that exact SM only) and 0x200000 a family target (`sm_120f`: that SM
and later minors of the same major).  This layout was read from vLLM 0.33.0's CUDA wheel and agrees
with what its build asks for (FP4 kernels for `10.0f;12.0f` with CUDA 13, `sm_90a` CUTLASS kernels);
the cubin's own ELF `e_flags` carry the SM (bits 8-15 in ABI 8) but not the a/f variant.

Which kernels an entry holds comes from the cubin's symbol table (or the PTX's `.entry` lines), so
the payload is decompressed: with the standard library's `compression.zstd` (Python 3.14), the
`zstandard` package, or the system's libzstd through ctypes; without any of them only the targets
are known, not which of them hold FP4 kernels.  No CUDA toolkit (`cuobjdump`) is needed.

Loading rules (CUDA programming guide, "binary compatibility"): a cubin for `sm_XY` runs on X.Z with
Z >= Y; `sm_XYf` likewise within the family; `sm_XYa` only on X.Y; PTX for `compute_XY` is compiled
by the driver for any later device (the `a`/`f` PTX variants with the cubin's restriction).
"""
from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_CUBIN = 1, 2
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000  # sm_XYa
FLAG_FAMILY = 0x200000         # sm_XYf
# Kernel names that are FP4 kernels: NVFP4/MXFP4 GEMMs, MoE and quantisation, CUTLASS's E2M1 type.
FP4_NAME = re.compile(r"fp4|e2m1", re.IGNORECASE)
_FP4_BYTES = re.compile(FP4_NAME.pattern.encode(), re.IGNORECASE)
_STT_FUNC = 2


@dataclass(frozen=True)
class Entry:
    kind: int          # KIND_CUBIN or KIND_PTX
    sm: int            # e.g. 120 for sm_120
    variant: str       # "", "a" or "f"
    flags: int
    payload: bytes     # as stored (compressed when flags & FLAG_ZSTD)
    size: int          # uncompressed size

    @property
    def target(self) -> str:
        return f"{'sm' if self.kind == KIND_CUBIN else 'compute'}_{self.sm}{self.variant}"

    def runs_on(self, device: tuple[int, int]) -> bool:
        """Whether the driver can run (cubin) or compile (PTX) this entry on a device `(major, minor)`."""
        major, minor = divmod(self.sm, 10)
        if self.variant == "a":
            return (major, minor) == tuple(device)
        if self.kind == KIND_PTX and not self.variant:
            return tuple(device) >= (major, minor)
        return device[0] == major and device[1] >= minor


def elf_section(data, name: str) -> memoryview | None:
    """The bytes of section `name` of a 64-bit little-endian ELF image (bytes or an mmap; None if
    absent or not ELF64)."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if not shoff or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
        return None
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    want = name.encode()
    view = memoryview(data)
    for name_off, sh_type, _flags, _addr, offset, size in headers:
        start = strtab + name_off
        if data[start:start + len(want) + 1] == want + b"\0":
            return None if sh_type == 8 else view[offset:offset + size]  # SHT_NOBITS has no bytes
    return None


def entries(section: bytes | memoryview) -> Iterator[Entry]:
    """Every entry of every fat-binary container in a `.nv_fatbin` section."""
    buf = memoryview(section)
    pos, end = 0, len(buf)
    while pos + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", buf, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned; padding between them
            continue
        e, stop = pos + header_size, min(end, pos + header_size + fat_size)
        while e + 64 <= stop:
            kind, _v, ehsize, padded = struct.unpack_from("<HHIQ", buf, e)
            if ehsize < 64:  # not an entry header: the container is corrupt
                break
            (stored,) = struct.unpack_from("<I", buf, e + 16)
            (sm,) = struct.unpack_from("<I", buf, e + 28)
            (flags,) = struct.unpack_from("<Q", buf, e + 40)
            (usize,) = struct.unpack_from("<Q", buf, e + 56)
            compressed = bool(flags & FLAG_ZSTD)
            length = stored if compressed and stored else padded
            variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
            if kind in (KIND_PTX, KIND_CUBIN):
                yield Entry(kind, sm, variant, flags, bytes(buf[e + ehsize:e + ehsize + length]),
                            usize if compressed else length)
            e += ehsize + padded
        pos = max(stop, pos + 16)


def _zstd_decompressor():
    try:
        from compression import zstd  # Python 3.14
        return lambda b, n: zstd.decompress(b)
    except ImportError:
        pass
    try:
        import zstandard
        return lambda b, n: zstandard.ZstdDecompressor().decompress(b, max_output_size=n)
    except ImportError:
        pass
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("zstd")
    if not name:
        return None
    lib = ctypes.CDLL(name)
    lib.ZSTD_decompress.restype = ctypes.c_size_t
    lib.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    lib.ZSTD_isError.restype = ctypes.c_uint
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]

    def decompress(data: bytes, size: int) -> bytes:
        out = ctypes.create_string_buffer(size)
        n = lib.ZSTD_decompress(out, size, data, len(data))
        if lib.ZSTD_isError(n):
            raise ValueError("zstd: corrupt payload")
        return out.raw[:n]
    return decompress


_DECOMPRESS: list = []


def decompressor():
    """`fn(data, uncompressed_size) -> bytes`, or None when no zstd implementation is available."""
    if not _DECOMPRESS:
        _DECOMPRESS.append(_zstd_decompressor())
    return _DECOMPRESS[0]


def kernel_names(entry: Entry, decompress=None) -> list[str] | None:
    """The kernels an entry defines (cubin: FUNC symbols; PTX: `.entry` names); None when the
    payload is compressed and nothing can decompress it."""
    data = entry.payload
    if entry.flags & FLAG_ZSTD:
        decompress = decompress or decompressor()
        if decompress is None:
            return None
        data = decompress(data, entry.size)
    if entry.kind == KIND_PTX:
        return re.findall(r"\.entry\s+([\w$.]+)", data.decode("latin-1"))
    symtab, strtab = elf_section(data, ".symtab"), elf_section(data, ".strtab")
    if symtab is None or strtab is None:
        return []
    names = []
    for off in range(0, len(symtab) - 23, 24):
        name_off, info = struct.unpack_from("<IB", symtab, off)
        if info & 0xF == _STT_FUNC:
            s = bytes(strtab[name_off:name_off + 512])
            names.append(s.split(b"\0", 1)[0].decode("latin-1"))
    return names


@dataclass
class LibraryPayload:
    """The targets one library carries, and which of them hold FP4 kernels."""

    path: str
    targets: dict[str, int] = field(default_factory=dict)       # target -> entries
    fp4_targets: dict[str, int] = field(default_factory=dict)   # target -> FP4 kernels
    fp4_entries: list[Entry] = field(default_factory=list, repr=False)
    kernels_known: bool = True   # False: compressed payloads and no zstd here

    @property
    def has_device_code(self) -> bool:
        return bool(self.targets)


def mentions_fp4(image) -> bool:
    """Whether the library's host side names FP4 at all (op names and strings in .rodata/.dynstr):
    only those libraries have their payloads decompressed."""
    for name in (".dynstr", ".rodata"):
        sec = elf_section(image, name)
        if sec is not None and _FP4_BYTES.search(sec):
            return True
    return False


def read_library(path: str | Path, decompress=None) -> LibraryPayload:
    """Read one shared library's device code (no `.nv_fatbin`: no targets).  The file is mapped,
    not read: only entry headers are touched unless the library mentions FP4."""
    import mmap

    out = LibraryPayload(str(path))
    with open(path, "rb") as fh:
        try:
            image = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty file
            return out
    try:
        return _read_image(image, out, decompress)
    finally:
        try:
            image.close()
        except BufferError:  # a view is still alive; the mapping goes with it
            pass


def _read_image(image, out: LibraryPayload, decompress) -> LibraryPayload:
    section = elf_section(image, ".nv_fatbin")
    if section is None:
        return out
    look = mentions_fp4(image)
    for entry in entries(section):
        out.targets[entry.target] = out.targets.get(entry.target, 0) + 1
        if not look:
            continue
        names = kernel_names(entry, decompress)
        if names is None:
            out.kernels_known = False
            continue
        fp4 = sum(1 for n in names if FP4_NAME.search(n))
        if fp4:
            out.fp4_targets[entry.target] = out.fp4_targets.get(entry.target, 0) + fp4
            out.fp4_entries.append(Entry(entry.kind, entry.sm, entry.variant, entry.flags, b"", entry.size))
    return out


def sm_text(device: tuple[int, int]) -> str:
    return f"sm_{device[0]}{device[1]}"
