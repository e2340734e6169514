"""`vllm-spark tune-moe`: tune vLLM's Triton fused-MoE kernel configs on this GPU for a model's MoE
shapes, and write them where the plugin merges them into `VLLM_TUNED_CONFIG_FOLDER`.

    vllm-spark tune-moe --model /models/Qwen3-30B-A3B [--tp 1] [--dtype auto|bf16|fp8_w8a8]
                        [--batch-sizes 1,2,4,...] [--out ~/.cache/vllm-spark/moe-configs] [--quick]

vLLM does not ship its `benchmark_moe.py` tuner in the wheel, so this is a small sweep of the same
kernel parameters (BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages) through vLLM's own
`fused_experts`, timed with CUDA events, restricted to tiles that fit GB10's shared memory
(101,376 bytes per block).  The output file is named exactly as vLLM looks it up
(`E=..,N=..,device_name=...[,dtype=..].json`, `N` = moe_intermediate_size / tp), with a
`triton_version` entry for provenance.

Only the Triton fused-MoE path reads these files (bf16 and FP8 MoE models); the NVFP4 MoE backends
(Marlin, FlashInfer CUTLASS, b12x, CUTLASS) do not.  Without a CUDA GPU the command exits 2.
"""
from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GB10_SMEM_BYTES = 101_376
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096)
DTYPES = ("auto", "bf16", "fp8_w8a8")


class TuneError(ValueError):
    pass


@dataclass
class MoEShape:
    experts: int
    hidden: int
    intermediate: int   # per tensor-parallel partition (vLLM's N)
    topk: int
    dtype: str | None   # None (bf16/fp16) or "fp8_w8a8"


def shape_from_model(model: str | Path, tp: int = 1, dtype: str = "auto") -> MoEShape:
    path = Path(model) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TuneError(f"cannot read {path}: {exc}") from None
    text = cfg.get("text_config", cfg)
    experts = next((text[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if text.get(k)), None)
    inter = text.get("moe_intermediate_size") or text.get("intermediate_size")
    hidden, topk = text.get("hidden_size"), text.get("num_experts_per_tok")
    if not (experts and inter and hidden and topk):
        raise TuneError(f"{path}: not an MoE config (needs num_experts, moe_intermediate_size, hidden_size, "
                        "num_experts_per_tok)")
    if inter % tp:
        raise TuneError(f"moe_intermediate_size {inter} is not divisible by --tp {tp}")
    qc = text.get("quantization_config") or cfg.get("quantization_config") or {}
    quant, algo = str(qc.get("quant_method", "")).lower(), str(qc.get("quant_algo", "")).upper()
    if dtype == "auto":
        if "NVFP4" in algo or "fp4" in quant:
            raise TuneError(f"{path}: an NVFP4 model: its MoE runs on Marlin/FlashInfer/b12x/CUTLASS kernels, "
                            "which do not read Triton configs; nothing to tune (pass --dtype to tune anyway)")
        if qc.get("weight_block_size") or qc.get("block_shape"):
            raise TuneError(f"{path}: block-quantised FP8 is not covered by this tuner")
        fp8 = quant == "fp8" or (quant.startswith("modelopt") and algo.startswith("FP8"))
        dtype = "fp8_w8a8" if fp8 else "bf16"
    return MoEShape(int(experts), int(hidden), int(inter) // tp, int(topk), None if dtype == "bf16" else dtype)


def smem_bytes(cfg: dict, dtype_bytes: int) -> int:
    """Shared memory the fused-MoE Triton kernel's pipelined A and B tiles need."""
    return (cfg["BLOCK_SIZE_M"] * cfg["BLOCK_SIZE_K"] + cfg["BLOCK_SIZE_K"] * cfg["BLOCK_SIZE_N"]) \
        * dtype_bytes * cfg["num_stages"]


def search_space(dtype: str | None, quick: bool = False, smem_limit: int = GB10_SMEM_BYTES) -> list[dict]:
    dtype_bytes = 1 if dtype == "fp8_w8a8" else 2
    if quick:
        grid = dict(m=(16, 64), n=(64, 128), k=(64, 128), g=(1, 16), w=(4,), s=(2, 3))
    else:
        grid = dict(m=(16, 32, 64, 128), n=(32, 64, 128, 256), k=(64, 128, 256), g=(1, 16, 32, 64),
                    w=(4, 8), s=(2, 3, 4))
    out = []
    for m, n, k, g, w, s in itertools.product(*grid.values()):
        cfg = {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": g,
               "num_warps": w, "num_stages": s}
        if smem_bytes(cfg, dtype_bytes) <= smem_limit:
            out.append(cfg)
    return out


def tune(batches, space: list[dict], bench: Callable[[dict, int], float],
         progress: Callable[[str], None] | None = None) -> dict[int, dict]:
    """For each batch size, the config with the lowest `bench(config, m)` time (configs that fail
    to compile or run are skipped)."""
    best: dict[int, dict] = {}
    for m in batches:
        times = []
        for cfg in space:
            try:
                times.append((bench(cfg, m), cfg))
            except Exception:
                continue
        if not times:
            raise TuneError(f"no config ran for batch size {m}")
        t, cfg = min(times, key=lambda x: x[0])
        best[m] = dict(cfg)
        if progress:
            progress(f"M={m}: {t * 1e6:.1f} us  {cfg}")
    return best


def write_configs(out_dir: Path, file_name: str, configs: dict[int, dict], triton_version: str | None) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    data: dict = {str(m): cfg for m, cfg in sorted(configs.items())}
    if triton_version:
        data["triton_version"] = triton_version
    path = out_dir / file_name
    path.write_text(json.dumps(data, indent=4) + "\n")
    return path


def gpu_bench(shape: MoEShape, iters: int = 20) -> Callable[[dict, int], float]:
    """Seconds per fused-MoE call of vLLM's Triton kernel with a given config (CUDA events)."""
    import torch

    from vllm_spark_plugin.vllm import kernels

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    e, h, n = shape.experts, shape.hidden, shape.intermediate
    w1 = torch.randn(e, 2 * n, h, device=dev, generator=g, dtype=torch.bfloat16) / h ** 0.5
    w2 = torch.randn(e, h, n, device=dev, generator=g, dtype=torch.bfloat16) / n ** 0.5
    quant_config = None
    if shape.dtype == "fp8_w8a8":
        w1, w2 = w1.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
        ones = torch.ones(e, device=dev, dtype=torch.float32)
        quant_config = kernels.fp8_w8a8_moe_quant_config(ones, ones, None, None)
    cache: dict[int, tuple] = {}

    def bench(cfg: dict, m: int) -> float:
        if m not in cache:
            x = torch.randn(m, h, device=dev, generator=g, dtype=torch.bfloat16)
            logits = torch.randn(m, e, device=dev, generator=g)
            w, ids = torch.topk(torch.softmax(logits, dim=-1), shape.topk, dim=-1)
            cache[m] = (x, w.to(torch.float32), ids.to(torch.int32))
        x, tw, ti = cache[m]
        for _ in range(2):
            kernels.run_triton_fused_moe(x, w1, w2, tw, ti, cfg, quant_config)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            kernels.run_triton_fused_moe(x, w1, w2, tw, ti, cfg, quant_config)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters

    return bench


def cuda_available() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def add_arguments(parser) -> None:
    from vllm_spark_plugin.moe.tuned_configs import USER_TUNED_DIR

    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model folder with config.json (MoE shapes are read from it)")
    src.add_argument("--shape", metavar="E,HIDDEN,INTERMEDIATE,TOPK",
                     help="explicit MoE shape instead of --model, e.g. 128,2048,768,8")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size you serve with (default 1)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="weight dtype of the MoE (default: from the model)")
    parser.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCHES)),
                        help="comma-separated token counts to tune (default: %(default)s)")
    parser.add_argument("--out", default=str(USER_TUNED_DIR), help="output folder (default: %(default)s, "
                        "merged by the plugin after VLLM_TUNED_CONFIG_FOLDER)")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per config (default 20)")
    parser.add_argument("--quick", action="store_true", help="a 64-config sweep instead of ~1000")


def run(args) -> int:
    try:
        if args.tp < 1:
            raise TuneError(f"--tp must be >= 1, got {args.tp}")
        batches = sorted({int(b) for b in str(args.batch_sizes).split(",") if b.strip()})
        if not batches or batches[0] < 1:
            raise TuneError(f"--batch-sizes must be positive integers, got {args.batch_sizes!r}")
        if args.model:
            shape = shape_from_model(args.model, args.tp, args.dtype)
        else:
            parts = [int(p) for p in args.shape.split(",")]
            if len(parts) != 4 or min(parts) < 1:
                raise TuneError(f"--shape needs four positive integers E,HIDDEN,INTERMEDIATE,TOPK, got {args.shape!r}")
            if parts[2] % args.tp:
                raise TuneError(f"INTERMEDIATE {parts[2]} is not divisible by --tp {args.tp}")
            shape = MoEShape(parts[0], parts[1], parts[2] // args.tp, parts[3],
                             None if args.dtype in ("auto", "bf16") else args.dtype)
    except (TuneError, ValueError) as exc:
        print(f"vllm-spark tune-moe: error: {exc}", file=sys.stderr)
        return 2
    if not cuda_available():
        print("vllm-spark tune-moe: no CUDA GPU here: tuning measures kernels on the GPU that will serve "
              "(run it on the DGX Spark)", file=sys.stderr)
        return 2
    from vllm_spark_plugin.vllm import kernels, platform

    space = search_space(shape.dtype, quick=args.quick)
    file_name = kernels.fused_moe_config_file_name(shape.experts, shape.intermediate, shape.dtype)
    print(f"tuning {file_name}: {len(space)} configs x {len(batches)} batch sizes on {platform.device_name()}")
    t0 = time.monotonic()
    try:
        configs = tune(batches, space, gpu_bench(shape, args.iters), progress=print)
    except TuneError as exc:
        print(f"vllm-spark tune-moe: error: {exc}", file=sys.stderr)
        return 1
    try:
        import triton
        tv = triton.__version__
    except Exception:
        tv = None
    path = write_configs(Path(args.out).expanduser(), file_name, configs, tv)
    print(f"wrote {path} in {time.monotonic() - t0:.0f} s; the plugin merges {path.parent} into "
          "VLLM_TUNED_CONFIG_FOLDER at the next vllm serve")
    return 0
