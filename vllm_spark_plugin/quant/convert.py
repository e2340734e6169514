"""`vllm-spark convert-nvfp4 SRC DST`: a bf16 Hugging Face checkpoint -> a ModelOpt NVFP4 checkpoint.

Streaming: tensors are read one fused group at a time (q/k/v, or gate/up of one expert, which share
one global scale as ModelOpt exports them and vLLM's fused kernels require) and written to shards
capped at `--shard-size`, so memory is bounded by one shard plus one group, not by the model.

What is quantised: every 2-D floating `*.weight` whose module is not excluded (attention and dense
projections, MoE experts).  Excluded by default: `lm_head`, embeddings, router gates, norms.
Per quantised module `M` the output holds:

    M.weight          uint8          [N, K/2]   two E2M1 values per byte, low nibble first
    M.weight_scale    float8_e4m3fn  [N, K/16]  one scale per 16 values
    M.weight_scale_2  float32        []         amax / (6 * 448)
    M.input_scale     float32        []         activation amax / (6 * 448) (--input-amax)

plus `hf_quant_config.json` and a `quantization_config` entry in `config.json` in ModelOpt's layout
(quant_algo NVFP4, group_size 16, exclude_modules / ignore).  Tokenizer and other small files are
copied.  `--dequantize` runs the inverse (NVFP4 -> bf16 checkpoint), as the plugin's reference
path dequantises at load.
"""
from __future__ import annotations

import fnmatch
import json
import logging
import re
import resource
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from vllm_spark_plugin.common import units
from vllm_spark_plugin.quant import nvfp4
from vllm_spark_plugin.quant.st_io import (
    INDEX_NAME,
    ShardWriter,
    TensorInfo,
    TensorReader,
    iter_names,
    tensor_infos,
)

log = logging.getLogger("vllm_spark_plugin")

DEFAULT_EXCLUDES = ("lm_head", "*embed_tokens*", "*.mlp.gate", "*shared_expert_gate",
                    "*router*", "*norm*", "*visual*", "*vision_tower*")
# Siblings vLLM fuses into one layer: they must share one global weight scale.
FUSED_SIBLINGS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv",
                  "gate_proj": "gate_up", "up_proj": "gate_up"}
# Default input_scale = 1.0: activation block scales then equal blockmax/6 in FP8, which covers
# |x| from about 0.01 to 2688.  Calibrated checkpoints (ModelOpt) are better for W4A4 kernels.
DEFAULT_INPUT_AMAX = nvfp4.FP4_E2M1_MAX * nvfp4.FP8_E4M3_MAX
WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")
SKIP_FILES = {INDEX_NAME, "config.json", "hf_quant_config.json"}
_FUSED_EXPERTS = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)(?:\.weight)?$")
_FLOAT_DTYPES = {"BF16", "F16", "F32", "F64"}


class ConvertError(RuntimeError):
    """A problem with the source checkpoint or the destination (message names the file/tensor)."""


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def module_of(tensor_name: str) -> str:
    return tensor_name[: -len(".weight")] if tensor_name.endswith(".weight") else tensor_name


def matching_pattern(module: str, patterns) -> str | None:
    for p in patterns:
        if module == p or fnmatch.fnmatchcase(module, p):
            return p
    return None


def group_key(module: str) -> str:
    parent, _, leaf = module.rpartition(".")
    return f"{parent}.{FUSED_SIBLINGS.get(leaf, leaf)}"


@dataclass
class Plan:
    groups: list[list[str]] = field(default_factory=list)      # weight names quantised together
    fused_experts: list[str] = field(default_factory=list)     # 3-D [E, ...] expert tensors to split
    copies: list[str] = field(default_factory=list)            # tensors written unchanged
    excluded: list[str] = field(default_factory=list)          # excluded linear modules (written as-is)
    matched_patterns: list[str] = field(default_factory=list)  # exclude patterns that matched
    auto_excluded: list[str] = field(default_factory=list)     # modules with dims not multiple of 16


def _quantisable(info: TensorInfo) -> bool:
    return info.name.endswith(".weight") and len(info.shape) == 2 and info.dtype in _FLOAT_DTYPES


def plan_conversion(infos: dict[str, TensorInfo], excludes) -> Plan:
    plan = Plan()
    matched: set[str] = set()
    groups: dict[str, list[str]] = {}
    for name in iter_names({k: v.path for k, v in infos.items()}):
        info = infos[name]
        fused = _FUSED_EXPERTS.match(name)
        if fused and len(info.shape) == 3 and info.dtype in _FLOAT_DTYPES:
            hit = matching_pattern(fused.group("prefix"), excludes)
            if hit is None:
                plan.fused_experts.append(name)
                continue
        if not _quantisable(info):
            plan.copies.append(name)
            continue
        module = module_of(name)
        hit = matching_pattern(module, excludes)
        if hit is not None:
            matched.add(hit)
            plan.excluded.append(module)
            plan.copies.append(name)
            continue
        groups.setdefault(group_key(module), []).append(name)
    for names in groups.values():
        if any(infos[n].shape[0] % nvfp4.GROUP_SIZE or infos[n].shape[1] % nvfp4.GROUP_SIZE for n in names):
            # vLLM fuses siblings into one layer: exclude all of them or none.
            for n in names:
                log.warning("convert-nvfp4: %s has shape %s (not a multiple of 16): kept in %s",
                            n, list(infos[n].shape), infos[n].dtype)
                plan.auto_excluded.append(module_of(n))
                plan.copies.append(n)
            continue
        plan.groups.append(sorted(names))
    plan.matched_patterns = [p for p in excludes if p in matched]
    return plan


def quant_config_entries(exclude_modules: list[str], group_size: int = nvfp4.GROUP_SIZE) -> tuple[dict, dict]:
    """(hf_quant_config.json, config.json quantization_config) in ModelOpt's two layouts."""
    from vllm_spark_plugin._version import __version__

    producer = {"name": "vllm-spark-plugin", "version": __version__}
    legacy = {"producer": producer,
              "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                               "group_size": group_size, "exclude_modules": list(exclude_modules)}}
    fmt = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": group_size}
    embedded = {"config_groups": {"group_0": {"input_activations": dict(fmt), "weights": dict(fmt),
                                              "targets": ["Linear"]}},
                "ignore": list(exclude_modules), "quant_algo": "NVFP4",
                "producer": producer, "quant_method": "modelopt"}
    return legacy, embedded


@dataclass
class ConvertReport:
    src: str
    dst: str
    direction: str
    tensors_in: int = 0
    tensors_out: int = 0
    quantized_modules: int = 0
    dequantized_modules: int = 0
    copied_tensors: int = 0
    exclude_modules: list = field(default_factory=list)
    shards: list = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0
    baseline_rss_bytes: int = 0
    peak_rss_bytes: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        mib = 1 << 20
        return (f"{self.direction}: {self.src} -> {self.dst}\n"
                f"  tensors in/out: {self.tensors_in}/{self.tensors_out}; quantised modules: "
                f"{self.quantized_modules}; dequantised: {self.dequantized_modules}; copied: {self.copied_tensors}\n"
                f"  exclude_modules: {', '.join(self.exclude_modules) or '(none)'}\n"
                f"  read {self.bytes_in / mib:.1f} MiB, wrote {self.bytes_out / mib:.1f} MiB in "
                f"{len(self.shards)} shard(s) in {self.seconds:.1f} s\n"
                f"  peak RSS {self.peak_rss_bytes / mib:.0f} MiB (process baseline before converting "
                f"{self.baseline_rss_bytes / mib:.0f} MiB)")


def _prepare_dst(src: Path, dst: Path, force: bool) -> None:
    if not src.is_dir():
        raise ConvertError(f"source {src} is not a folder")
    if not (src / "config.json").exists():
        raise ConvertError(f"source {src} has no config.json")
    if dst.resolve() == src.resolve():
        raise ConvertError("destination must differ from the source")
    if dst.exists() and any(dst.iterdir()):
        if not force:
            raise ConvertError(f"destination {dst} exists and is not empty (use --force to overwrite)")
        for p in dst.iterdir():
            if p.is_file() and (p.suffix == ".safetensors" or p.name.endswith(".partial")
                                or p.name in (INDEX_NAME, "hf_quant_config.json")):
                p.unlink()
    dst.mkdir(parents=True, exist_ok=True)


def _copy_side_files(src: Path, dst: Path) -> None:
    """Tokenizer, generation config, chat template...: every small non-weight file."""
    for p in sorted(src.iterdir()):
        if not p.is_file() or p.name.startswith(".") or p.name in SKIP_FILES:
            continue
        if p.name.endswith(WEIGHT_FILE_SUFFIXES):
            if p.suffix != ".safetensors":
                log.warning("convert-nvfp4: %s is not safetensors; not copied", p.name)
            continue
        shutil.copy2(p, dst / p.name)


def _emit(writer: ShardWriter, module: str, q: nvfp4.NvFp4Weight, input_scale: torch.Tensor) -> None:
    writer.add(f"{module}.weight", q.weight)
    writer.add(f"{module}.weight_scale", q.weight_scale)
    writer.add(f"{module}.weight_scale_2", q.weight_scale_2.reshape(()).clone())
    writer.add(f"{module}.input_scale", input_scale.clone())


def convert(src: str | Path, dst: str | Path, excludes=DEFAULT_EXCLUDES, shard_bytes: int = 2 << 30,
            input_amax: float = DEFAULT_INPUT_AMAX, force: bool = False) -> ConvertReport:
    """Convert a bf16/fp16/fp32 safetensors checkpoint to ModelOpt NVFP4 (see module doc)."""
    src, dst = Path(src), Path(dst)
    t0 = time.monotonic()
    report = ConvertReport(str(src), str(dst), "bf16 -> NVFP4", baseline_rss_bytes=peak_rss_bytes())
    _prepare_dst(src, dst, force)
    if not (input_amax > 0 and input_amax != float("inf")):
        raise ConvertError(f"--input-amax must be a positive finite number, got {input_amax}")
    infos = tensor_infos(src)
    plan = plan_conversion(infos, list(excludes))
    files = {k: v.path for k, v in infos.items()}
    reader = TensorReader(files)
    writer = ShardWriter(dst, shard_bytes)
    input_scale = torch.tensor(input_amax / (nvfp4.FP4_E2M1_MAX * nvfp4.FP8_E4M3_MAX), dtype=torch.float32)
    cfg = json.loads((src / "config.json").read_text())

    def where(name: str) -> str:
        return f"{name} in {files[name].name}"

    for name in plan.copies:
        writer.add(name, reader.get(name))
        report.copied_tensors += 1
    for names in plan.groups:
        tensors = [reader.get(n) for n in names]
        for n, t in zip(names, tensors):
            nvfp4.check_finite(t, where(n))
        shared = max(nvfp4.amax(t) for t in tensors)
        for n, t in zip(names, tensors):
            _emit(writer, module_of(n), nvfp4.quantize_weight(t, shared, name=where(n)), input_scale)
            report.quantized_modules += 1
        del tensors
    for name in plan.fused_experts:
        _convert_fused_experts(name, reader.get(name), cfg, writer, input_scale, where(name), report)
    reader.close()
    shards = writer.finish()

    exclude_modules = sorted(set(plan.matched_patterns) | set(plan.auto_excluded),
                             key=lambda s: (s not in plan.matched_patterns, s))
    legacy, embedded = quant_config_entries(exclude_modules)
    (dst / "hf_quant_config.json").write_text(json.dumps(legacy, indent=2) + "\n")
    cfg["quantization_config"] = embedded
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    _copy_side_files(src, dst)

    report.tensors_in = len(infos)
    report.tensors_out = len(writer_names(shards))
    report.exclude_modules = exclude_modules
    report.shards = [p.name for p in shards]
    report.bytes_in = reader.bytes_read
    report.bytes_out = writer.total_bytes
    report.peak_rss_bytes = peak_rss_bytes()
    report.seconds = time.monotonic() - t0
    return report


def writer_names(shards: list[Path]) -> list[str]:
    from safetensors import safe_open

    names: list[str] = []
    for p in shards:
        with safe_open(str(p), "pt") as fh:
            names.extend(fh.keys())
    return names


def _convert_fused_experts(name: str, t: torch.Tensor, cfg: dict, writer: ShardWriter,
                           input_scale: torch.Tensor, where: str, report: ConvertReport) -> None:
    """Split a fused [E, 2I, H] gate_up_proj / [E, H, I] down_proj tensor into the per-expert
    `experts.{e}.gate_proj/up_proj/down_proj` modules vLLM's ModelOpt loader expects."""
    m = _FUSED_EXPERTS.match(name)
    assert m is not None
    prefix, kind = m.group("prefix"), m.group("kind")
    text_cfg = cfg.get("text_config", cfg)
    hidden = text_cfg.get("hidden_size")
    inter = text_cfg.get("moe_intermediate_size")
    e = t.shape[0]
    if kind == "gate_up_proj":
        if hidden is None or inter is None or tuple(t.shape[1:]) != (2 * inter, hidden):
            raise ConvertError(f"{where}: fused gate_up_proj of shape {list(t.shape)} does not match "
                               f"[experts, 2*moe_intermediate_size={2 * (inter or 0)}, hidden_size={hidden}]")
        for i in range(e):
            gate, up = t[i, :inter], t[i, inter:]
            nvfp4.check_finite(t[i], f"{where} (expert {i})")
            shared = torch.maximum(nvfp4.amax(gate), nvfp4.amax(up))
            for leaf, w in (("gate_proj", gate), ("up_proj", up)):
                mod = f"{prefix}.{i}.{leaf}"
                _emit(writer, mod, nvfp4.quantize_weight(w.contiguous(), shared, name=f"{where} ({mod})"), input_scale)
                report.quantized_modules += 1
    else:
        if hidden is None or inter is None or tuple(t.shape[1:]) != (hidden, inter):
            raise ConvertError(f"{where}: fused down_proj of shape {list(t.shape)} does not match "
                               f"[experts, hidden_size={hidden}, moe_intermediate_size={inter}]")
        for i in range(e):
            mod = f"{prefix}.{i}.down_proj"
            _emit(writer, mod, nvfp4.quantize_weight(t[i].contiguous(), name=f"{where} ({mod})"), input_scale)
            report.quantized_modules += 1


def dequantize_checkpoint(src: str | Path, dst: str | Path, dtype: torch.dtype = torch.bfloat16,
                          shard_bytes: int = 2 << 30, force: bool = False) -> ConvertReport:
    """Inverse: an NVFP4 checkpoint -> a plain `dtype` checkpoint, dequantising exactly as the
    plugin's reference path does at load (`nvfp4.dequantize`).  Input scales are dropped."""
    src, dst = Path(src), Path(dst)
    t0 = time.monotonic()
    report = ConvertReport(str(src), str(dst), "NVFP4 -> " + str(dtype).replace("torch.", ""),
                           baseline_rss_bytes=peak_rss_bytes())
    _prepare_dst(src, dst, force)
    infos = tensor_infos(src)
    files = {k: v.path for k, v in infos.items()}
    reader = TensorReader(files)
    writer = ShardWriter(dst, shard_bytes)
    suffixes = (".weight_scale", ".weight_scale_2", ".input_scale")
    for name in iter_names(files):
        if name.endswith(suffixes):
            continue
        info = infos[name]
        module = module_of(name)
        if name.endswith(".weight") and info.dtype == "U8" and f"{module}.weight_scale" in infos:
            for part in ("weight_scale", "weight_scale_2"):
                if f"{module}.{part}" not in infos:
                    raise ConvertError(f"{module}.{part} is missing (needed for {name} in {files[name].name})")
            w = nvfp4.dequantize(reader.get(name), reader.get(f"{module}.weight_scale"),
                                 reader.get(f"{module}.weight_scale_2"), dtype)
            writer.add(name, w)
            report.dequantized_modules += 1
        else:
            writer.add(name, reader.get(name))
            report.copied_tensors += 1
    reader.close()
    shards = writer.finish()
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    _copy_side_files(src, dst)
    report.tensors_in = len(infos)
    report.tensors_out = len(writer_names(shards))
    report.shards = [p.name for p in shards]
    report.bytes_in = reader.bytes_read
    report.bytes_out = writer.total_bytes
    report.peak_rss_bytes = peak_rss_bytes()
    report.seconds = time.monotonic() - t0
    return report


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------
def add_arguments(parser) -> None:
    parser.add_argument("src", help="source checkpoint folder (bf16/fp16 safetensors + config.json)")
    parser.add_argument("dst", help="destination folder (created)")
    parser.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                        help="module name or fnmatch pattern to keep unquantised (repeatable), e.g. "
                             "'model.layers.0.*'; added to the defaults: " + ", ".join(DEFAULT_EXCLUDES))
    parser.add_argument("--no-default-excludes", action="store_true",
                        help="use only the --exclude patterns given")
    parser.add_argument("--shard-size", default="2GB", help="max output shard size (default: %(default)s); "
                        "peak memory grows with it")
    parser.add_argument("--input-amax", type=float, default=DEFAULT_INPUT_AMAX,
                        help="activation amax used for every input_scale = amax/2688 (default: %(default)s, "
                             "i.e. input_scale 1.0; uncalibrated)")
    parser.add_argument("--dequantize", action="store_true",
                        help="inverse direction: NVFP4 SRC -> bf16 DST (what the reference path loads)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty destination")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        shard = units.parse_size(args.shard_size, examples="2GB, 500MB")
        if shard <= 0:
            raise ValueError(f"size must be positive: {args.shard_size!r}")
        if args.dequantize:
            report = dequantize_checkpoint(args.src, args.dst, shard_bytes=shard, force=args.force)
        else:
            excludes = list(args.exclude) + ([] if args.no_default_excludes else list(DEFAULT_EXCLUDES))
            report = convert(args.src, args.dst, excludes=excludes, shard_bytes=shard,
                             input_amax=args.input_amax, force=args.force)
    except (ConvertError, nvfp4.NvFp4Error, ValueError, OSError) as exc:
        print(f"vllm-spark convert-nvfp4: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(report), indent=2) if args.json else report.summary())
    return 0
