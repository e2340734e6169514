"""Validate a ModelOpt NVFP4 checkpoint before vLLM loads it: every defect is named with its tensor
and file, instead of surfacing later as a shape assertion deep in a kernel or as garbage output.

Checks:
* the quantisation config (`config.json` `quantization_config`, `hf_quant_config.json`):
  quant_algo NVFP4 / W4A16_NVFP4 and group size 16;
* per quantised module `M` (one that has a uint8 `M.weight` or any NVFP4 scale): `M.weight` uint8
  [N, K/2], `M.weight_scale` float8_e4m3fn [N, K/16], `M.weight_scale_2` fp32 scalar and, for W4A4
  checkpoints, `M.input_scale` fp32 scalar are present with those dtypes and shapes (a scale
  matching [N, K/32] is reported as group size 32);
* values: `weight_scale_2` / `input_scale` finite and > 0; block scales not NaN, not negative and
  not all zero;
* MoE completeness: every expert index 0..E-1 (E from config.json) has every projection its
  siblings have.

Memory: headers are read without touching tensor data; scale tensors are read one at a time.
"""
from __future__ import annotations

import json
import logging
import re
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vllm_spark_plugin.quant.st_io import CheckpointLayoutError, TensorInfo, TensorReader, tensor_infos

log = logging.getLogger("vllm_spark_plugin")

NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
GROUP_SIZE = 16
MAX_LISTED = 12
_EXPERT = re.compile(r"^(?P<parent>.+\.experts)\.(?P<idx>\d+)\.(?P<leaf>.+)$")
_SCALE_SUFFIXES = (".weight_scale_2", ".weight_scale", ".input_scale")


class CheckpointError(ValueError):
    """A malformed NVFP4 checkpoint; the message names each offending tensor and file."""


@dataclass
class ValidationReport:
    path: str
    quant_algo: str | None = None
    group_size: int | None = None
    modules: int = 0
    tensors: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def message(self) -> str:
        shown = self.problems[:MAX_LISTED]
        more = len(self.problems) - len(shown)
        return (f"NVFP4 checkpoint {self.path} is malformed ({len(self.problems)} problem(s)):\n  - "
                + "\n  - ".join(shown) + (f"\n  - ... and {more} more" if more > 0 else ""))


def read_quant_config(folder: Path) -> tuple[str | None, int | None, list[str]]:
    """(quant_algo, group_size, problems) from config.json's quantization_config (what vLLM reads
    first) and hf_quant_config.json."""
    problems: list[str] = []
    algo: str | None = None
    group: int | None = None
    sources: list[tuple[str, dict]] = []
    cfg_path = folder / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        return None, None, [f"{cfg_path}: cannot read ({exc})"]
    qc = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config")
    if isinstance(qc, dict):
        sources.append(("config.json quantization_config", qc))
    hq = folder / "hf_quant_config.json"
    if hq.exists():
        try:
            data = json.loads(hq.read_text())
            sources.append(("hf_quant_config.json quantization", data.get("quantization", data)))
        except ValueError as exc:
            problems.append(f"{hq}: not valid JSON ({exc})")
    if not sources:
        return None, None, [f"{folder}: no quantization_config in config.json and no hf_quant_config.json"]
    for where, q in sources:
        a = str(q.get("quant_algo", "") or "").upper()
        if a and a not in NVFP4_ALGOS:
            problems.append(f"{where}: quant_algo {a!r} is not NVFP4")
        algo = algo or a or None
        sizes = []
        if "group_size" in q:
            sizes.append(("group_size", q["group_size"]))
        for gname, grp in (q.get("config_groups") or {}).items():
            for part in ("weights", "input_activations"):
                spec = (grp or {}).get(part)
                if isinstance(spec, dict) and "group_size" in spec:
                    sizes.append((f"config_groups.{gname}.{part}.group_size", spec["group_size"]))
        for key, value in sizes:
            try:
                v = int(value)
            except (TypeError, ValueError):
                problems.append(f"{where}: {key} is {value!r}, not an integer")
                continue
            if v != GROUP_SIZE:
                problems.append(f"{where}: {key} is {v}; NVFP4 uses group size {GROUP_SIZE}")
            group = group if group is not None else v
    return algo, group, problems


def _num_experts(folder: Path) -> int | None:
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg)
    for key in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):
        v = cfg.get(key)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _module_tensors(infos: dict[str, TensorInfo]) -> dict[str, dict[str, TensorInfo]]:
    """Quantised module -> {part: info} for part in weight / weight_scale / weight_scale_2 / input_scale."""
    modules: dict[str, dict[str, TensorInfo]] = defaultdict(dict)
    for name, info in infos.items():
        for suffix in _SCALE_SUFFIXES:
            if name.endswith(suffix):
                modules[name[: -len(suffix)]][suffix[1:]] = info
                break
    for name, info in infos.items():
        if name.endswith(".weight"):
            m = name[: -len(".weight")]
            if info.dtype == "U8" or m in modules:
                modules[m]["weight"] = info
    return modules


def _where(info: TensorInfo) -> str:
    return f"{info.name} in {info.path.name}"


def check_structure(infos: dict[str, TensorInfo], algo: str | None, num_experts: int | None) -> tuple[list[str], dict]:
    problems: list[str] = []
    modules = _module_tensors(infos)
    need_input = (algo or "NVFP4") == "NVFP4"
    for m, parts in sorted(modules.items()):
        anchor = parts.get("weight") or next(iter(parts.values()))
        required = ["weight", "weight_scale", "weight_scale_2"] + (["input_scale"] if need_input else [])
        missing = [p for p in required if p not in parts]
        for p in missing:
            problems.append(f"missing tensor {m}.{p} (module {m} has {anchor.name} in {anchor.path.name})")
        dtypes = {"weight": "U8", "weight_scale": "F8_E4M3", "weight_scale_2": "F32", "input_scale": "F32"}
        for p, info in parts.items():
            if info.dtype != dtypes[p]:
                problems.append(f"dtype mismatch: {_where(info)} is {info.dtype}, NVFP4 needs {dtypes[p]}")
        w, s = parts.get("weight"), parts.get("weight_scale")
        if w is not None and len(w.shape) != 2:
            problems.append(f"shape mismatch: {_where(w)} is {list(w.shape)}, expected 2-D [N, K/2]")
        elif w is not None and s is not None:
            n, k_half = w.shape
            k = 2 * k_half
            expect = [n, k // GROUP_SIZE]
            if len(s.shape) != 2 or s.shape[0] != n or k % GROUP_SIZE or s.shape[1] != k // GROUP_SIZE:
                if len(s.shape) == 2 and s.shape[0] == n and s.shape[1] and k % s.shape[1] == 0 \
                        and k // s.shape[1] != GROUP_SIZE:
                    problems.append(f"group size {k // s.shape[1]}: {_where(s)} is {list(s.shape)} for "
                                    f"{w.name} {list(w.shape)} (K={k}); NVFP4 needs group size {GROUP_SIZE}, "
                                    f"i.e. {expect}")
                else:
                    problems.append(f"shape mismatch: {_where(s)} is {list(s.shape)}, but {w.name} "
                                    f"{list(w.shape)} needs {expect}")
        for p in ("weight_scale_2", "input_scale"):
            info = parts.get(p)
            if info is not None and int(torch.tensor(info.shape).prod()) != 1:
                problems.append(f"shape mismatch: {_where(info)} is {list(info.shape)}, expected a scalar")
    # MoE completeness: every expert has every projection its siblings have.
    experts: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for m in modules:
        hit = _EXPERT.match(m)
        if hit:
            experts[hit.group("parent")][hit.group("leaf")].add(int(hit.group("idx")))
    for parent, leaves in sorted(experts.items()):
        expected = set(range(num_experts)) if num_experts else set().union(*leaves.values())
        for leaf, ids in sorted(leaves.items()):
            for i in sorted(expected - ids):
                sib = next(iter(sorted(ids)), None)
                hint = ""
                if sib is not None:
                    sib_info = modules[f"{parent}.{sib}.{leaf}"].get("weight")
                    if sib_info is not None:
                        hint = f" (expert {sib}'s is in {sib_info.path.name})"
                problems.append(f"missing tensor {parent}.{i}.{leaf}.weight{hint}")
    return problems, modules


def check_values(modules: dict[str, dict[str, TensorInfo]], reader: TensorReader) -> list[str]:
    problems: list[str] = []
    for m, parts in sorted(modules.items()):
        for p in ("weight_scale_2", "input_scale"):
            info = parts.get(p)
            if info is None or info.dtype != "F32":
                continue
            v = reader.get(info.name).float().reshape(-1)
            if bool(torch.isnan(v).any()):
                problems.append(f"NaN scale: {_where(info)}")
            elif bool(torch.isinf(v).any()):
                problems.append(f"inf scale: {_where(info)}")
            elif bool((v == 0).any()):
                problems.append(f"zero scale: {_where(info)} (dequantises the module to zero)")
            elif bool((v < 0).any()):
                problems.append(f"negative scale: {_where(info)} = {v.tolist()}")
        info = parts.get("weight_scale")
        if info is None or info.dtype != "F8_E4M3":
            continue
        # On the raw E4M3 bytes (no float copy): 0x7F/0xFF are NaN, bit 7 is the sign.
        b = reader.get(info.name).view(torch.uint8)
        mag = b & 0x7F
        nan = mag == 0x7F
        if bool(nan.any()):
            problems.append(f"NaN scale: {_where(info)} at block {torch.nonzero(nan)[0].tolist()}")
        elif bool(((b & 0x80) != 0).logical_and_(mag != 0).any()):
            problems.append(f"negative block scale: {_where(info)}")
        elif b.numel() and not bool(mag.any()):
            problems.append(f"zero scale: every block scale of {_where(info)} is 0 (the weight dequantises to zero)")
    return problems


def validate_checkpoint(path: str | Path, check_values_too: bool = True) -> ValidationReport:
    """Validate an NVFP4 checkpoint folder; returns a report (see `ValidationReport.problems`)."""
    folder = Path(path)
    report = ValidationReport(str(folder))
    algo, group, problems = read_quant_config(folder)
    report.quant_algo, report.group_size = algo, group
    report.problems.extend(problems)
    try:
        infos = tensor_infos(folder)
    except (CheckpointLayoutError, OSError, ValueError) as exc:
        report.problems.append(str(exc))
        return report
    report.tensors = len(infos)
    structural, modules = check_structure(infos, algo, _num_experts(folder))
    report.modules = len(modules)
    report.problems.extend(structural)
    if check_values_too:
        reader = TensorReader({k: v.path for k, v in infos.items()})
        try:
            report.problems.extend(check_values(modules, reader))
        finally:
            reader.close()
    if not modules:
        report.problems.append(f"{folder}: no NVFP4-quantised tensors found (no uint8 *.weight with scales)")
    return report


def validate(path: str | Path) -> ValidationReport:
    """Validate and raise CheckpointError with every problem named."""
    report = validate_checkpoint(path)
    if not report.ok:
        raise CheckpointError(report.message())
    return report


_validated: dict[str, bool] = {}
_lock = threading.Lock()


def validate_at_load(model: str, group_size: int | None = None) -> None:
    """Called when vLLM builds the quantisation config.  Local folders only (a hub id is checked by
    vLLM's own loader); each folder once per process."""
    folder = Path(model)
    if not folder.is_dir():
        log.debug("vllm-spark-plugin: %s is not a local folder; NVFP4 checkpoint validation skipped", model)
        return
    key = str(folder.resolve())
    with _lock:
        if _validated.get(key):
            return
    report = validate_checkpoint(folder)
    if report.ok and group_size is not None and group_size != GROUP_SIZE:
        report.problems.append(f"the quantization config's group size is {group_size}; NVFP4 uses {GROUP_SIZE}")
    if not report.ok:
        raise CheckpointError(report.message())
    log.info("vllm-spark-plugin: NVFP4 checkpoint %s validated: %d quantised modules, %d tensors, "
             "quant_algo %s, group size %s", folder, report.modules, report.tensors, report.quant_algo,
             report.group_size)
    with _lock:
        _validated[key] = True
