"""Human-readable rendering of a plan (text table) and its plot (matplotlib, Agg backend)."""
from __future__ import annotations

from pathlib import Path


def _f(x, fmt="{:.1f}", none="-"):
    return none if x is None else fmt.format(x)


def _gb(x):
    return "-" if x is None else f"{x / 1e9:.2f} GB"


def render_table(plan: dict) -> str:
    i, m, mem, s, k, cap, fl, cal = (plan[x] for x in ("inputs", "model", "memory", "step_model", "knee",
                                                       "capacity", "fleet", "calibration"))
    out: list[str] = []
    w = out.append
    w(f"vllm-spark plan: {m['name']} on {i['sparks']} x {i['hardware']} "
      f"(tp {i['tp']}, pp {i['pp']}, replicas {i['dp']})")
    w(f"  weights {i['weight_format']} | KV {i['kv_dtype']} | recurrent state {i['state_dtype']} | "
      f"compute {i['compute_dtype']} | context {i['context_tokens']} tokens | prompt {i['prompt_tokens']} tokens")
    formats = {c: f for c, f in i["component_formats"].items() if m["params_by_component"].get(c)}
    w("  component formats: " + ", ".join(f"{c}={f}" for c, f in formats.items()))
    w(f"  parameters: {m['total_params'] / 1e9:.2f}B total, {m['active_params'] / 1e9:.2f}B active per token")
    sv = i["serving"]
    spec = sv.get("spec")
    w(f"  serving: engine {sv['engine']}, MoE backend {sv['moe_backend']}, linear backend {sv['linear_backend']}"
      + (", --enforce-eager" if sv["enforce_eager"] else "") + (", expert parallel" if sv["expert_parallel"] else "")
      + (f", speculative {spec['method']} x{spec['num_tokens']} ({s['emitted_tokens_per_step']:.2f} tokens emitted per step)"
         if spec else ""))
    if m.get("experts"):
        w(f"  routing skew {s['routing_skew']:.3f} ({s['routing_skew_source']})")
    w("")
    w("Memory fit (per node)")
    for n, step in enumerate(mem["steps"], 1):
        w(f"  {n:2d}. {step}")
    w("")
    w("Decode step model  t(b) = alpha + beta*b")
    w(f"  bandwidth {s['bandwidth_bytes_per_second'] / 1e9:.0f} GB/s used = nominal "
      f"{s['bandwidth_nominal_bytes_per_second'] / 1e9:.0f} GB/s x efficiency {cal['bandwidth_efficiency']:.3f}"
      + (f" (measured copy {s['bandwidth_measured_bytes_per_second'] / 1e9:.0f} GB/s)" if s.get("bandwidth_measured_bytes_per_second") else ""))
    w(f"  compute {s['compute_flops_per_second'] / 1e12:.0f} TFLOP/s used = {s['compute_dtype']} peak "
      f"{s['peak_flops_per_second'] / 1e12:.0f} x efficiency {cal['compute_efficiency']:.3f}")
    w(f"  fixed overhead {s['fixed_overhead_seconds'] * 1e3:.2f} ms = ({s['kernels_per_step']:.0f} kernels x kernel latency "
      f"+ per-step host work) x overhead scale {cal['overhead_scale']:.3f}")
    c1, c64 = s["components_at_1"], s["components_at_64"]
    for label, c in (("b=1 ", c1), ("b=64", c64)):
        w(f"  {label}: overhead {c['overhead'] * 1e3:.2f} + weights {c['weights'] * 1e3:.2f} + experts "
          f"{c['experts'] * 1e3:.2f} + KV/state {c['kv_and_state'] * 1e3:.2f} + compute {c['compute'] * 1e3:.2f} + "
          f"comm {c['comm'] * 1e3:.2f}" + (f" + draft {c['draft'] * 1e3:.2f}" if c.get("draft") else "")
          + f" = {(c['overhead'] + c['weights'] + c['experts'] + c['kv_and_state'] + c['compute'] + c['comm'] + c.get('draft', 0)) * 1e3:.2f} ms"
          + (f"  ({c['experts_touched_per_layer']:.1f} experts touched per MoE layer)" if m.get("experts") else ""))
    w(f"  physical split at b=1: alpha {s['alpha_at_1_seconds'] * 1e3:.2f} ms, beta {s['beta_physical_seconds'] * 1e3:.3f} ms/stream")
    w(f"  linear fit over b={s['fit_range'][0]}..{s['fit_range'][1]}: alpha {s['alpha_seconds'] * 1e3:.2f} ms, "
      f"beta {s['beta_seconds'] * 1e3:.3f} ms/stream (R^2 {s['fit_r2']:.3f}, worst point {s['fit_max_relative_error'] * 100:.0f}% off)")
    w(f"  knee K = alpha/beta = {_f(k['concurrency'])} streams; plateau 1/beta = {_f(k['plateau_tokens_per_second'])} tok/s")
    w("")
    w(f"{'streams':>8} {'step ms':>9} {'per-stream':>11} {'aggregate':>10} {'TTFT s':>8} {'TTFT wave':>10} {'fits':>5}")
    for row in plan["curve"]:
        fits = {True: "yes", False: "NO", None: "-"}[row["fits_memory"]]
        w(f"{row['concurrency']:>8d} {row['step_seconds'] * 1e3:>9.2f} {row['per_stream_tokens_per_second']:>11.2f} "
          f"{row['aggregate_tokens_per_second']:>10.1f} {row['ttft_seconds']:>8.3f} {row['ttft_wave_median_seconds']:>10.3f} {fits:>5}")
    w("  (tok/s; TTFT = own prefill + one step; TTFT wave = median when all streams arrive together)")
    w("")
    w(f"Capacity at the {cap['floor_tokens_per_second']:g} tok/s per-stream floor: "
      + (f"{cap['streams']} streams per replica ({_f(cap['aggregate_tokens_per_second'])} tok/s aggregate, "
         f"{_f(cap['per_stream_tokens_per_second'], '{:.2f}')} tok/s per stream, TTFT {_f(cap['ttft_seconds'], '{:.3f}')} s)"
         if cap["streams"] else "none (even one stream is below the floor, or nothing fits)")
      + f"; memory allows {cap['memory_max_streams']}, max_num_seqs {cap['max_num_seqs']}")
    w(f"Fleet: {fl['sparks']} Spark(s) = {fl['replicas']} replica(s) x tp {fl['tp']} x pp {fl['pp']}: "
      f"{_f(fl['capacity_streams'], '{}')} streams at the floor, {_f(fl['aggregate_tokens_per_second_at_capacity'])} tok/s there, "
      f"plateau {_f(fl['plateau_tokens_per_second'])} tok/s")
    if fl.get("link"):
        w(_link_line(fl["link"]))
    src = cal["source"] + (f" ({cal['file']})" if cal.get("file") else "")
    w(f"Efficiency: bandwidth {cal['bandwidth_efficiency']:.3f}, compute {cal['compute_efficiency']:.3f}, "
      f"overhead scale {cal['overhead_scale']:.3f}, link scale {cal.get('link_scale', 1.0):.3f} [{src}]")
    if cal.get("model_factors"):
        mf = cal["model_factors"]
        w(f"  model factors ({m['name']} only): overhead x{mf['overhead_scale']:.3f}, per-stream work "
          f"x{mf['per_stream_scale']:.3f}" + ("" if mf["routing_skew"] is None else f", routing skew {mf['routing_skew']:.3f}"))
    if cal["bandwidth_efficiency"] > 1:
        w(f"  note: bandwidth efficiency {cal['bandwidth_efficiency']:.2f} > 1 means the run moved fewer bytes than "
          "the model counts (e.g. skewed routing touching fewer distinct experts than uniform routing, or a "
          "smaller state/KV dtype than assumed), not that the memory ran above its nominal rate")
    if cal.get("fit"):
        for p in cal["fit"]["points"]:
            w(f"  fit point b={p['concurrency']:g}: observed {_f(p.get('observed_aggregate_tokens_per_second'))} tok/s, "
              f"predicted {_f(p.get('predicted_aggregate_tokens_per_second'))} tok/s ({p['relative_error'] * 100:+.1f}%)")
    if not mem["fits"]:
        w("WARNING: the model does not fit at this context; see the memory steps above.")
    return "\n".join(out) + "\n"


def _pct(share):
    return "-" if share is None else f"{-share * 100:+.1f}%"


def _link_line(link: dict) -> str:
    """What the measured link costs the fleet, predicted at the profile's link and at the measured rate."""
    from vllm_spark_plugin.plan.links import format_rate

    head = f"Link: {format_rate(link['rate_bytes_per_second'])} from {link['source']}"
    if not link["enters"]:
        return f"{head}: {link['note']}"
    head += f", against the profile's {link['profile_bandwidth_bytes_per_second'] / 1e9:.3g} GB/s"
    return (f"{head}: at {link['reference_concurrency']} streams per replica the fleet's "
            f"{_f(link['aggregate_tokens_per_second_at_nominal'])} -> "
            f"{_f(link['aggregate_tokens_per_second_at_measured'])} tok/s ({_pct(link['throughput_cost_share'])} of the "
            f"predicted throughput), capacity at the floor {_f(link['capacity_streams_at_nominal'], '{}')} -> "
            f"{_f(link['capacity_streams_at_measured'], '{}')} streams, prefill "
            f"{_f(link['prefill_tokens_per_second_at_nominal'], '{:.0f}')} -> {_f(link['prefill_tokens_per_second_at_measured'], '{:.0f}')} "
            f"tok/s ({_pct(link['prefill_cost_share'])})")


def write_plot(plan: dict, path: str | Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = plan["curve"]
    b = [r["concurrency"] for r in curve]
    agg = [r["aggregate_tokens_per_second"] for r in curve]
    per = [r["per_stream_tokens_per_second"] for r in curve]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    ax.plot(b, agg, "o-", color="tab:blue", label="aggregate tok/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate tokens/s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(b, per, "s--", color="tab:orange", label="per-stream tok/s")
    ax2.set_ylabel("per-stream tokens/s", color="tab:orange")
    floor = plan["capacity"]["floor_tokens_per_second"]
    ax2.axhline(floor, color="tab:red", lw=1, ls=":", label=f"floor {floor:g} tok/s")
    knee = plan["knee"]["concurrency"]
    if knee:
        ax.axvline(knee, color="gray", lw=1, ls="-.", label=f"knee K={knee:.1f}")
    cap = plan["capacity"]["streams"]
    if cap:
        ax.axvline(cap, color="tab:red", lw=1, ls="--", label=f"capacity {cap}")
    mem_max = plan["memory"]["max_concurrent_streams"]
    if mem_max and mem_max < max(b):
        ax.axvspan(mem_max, max(b), color="gray", alpha=0.15, label="beyond memory")
    plateau = plan["knee"]["plateau_tokens_per_second"]
    if plateau:
        ax.axhline(plateau, color="tab:blue", lw=0.8, ls=":", label=f"plateau {plateau:.0f} tok/s")
    i = plan["inputs"]
    ax.set_title(f"{plan['model']['name']} ({i['weight_format']}) on {i['sparks']} x {i['hardware']}, "
                 f"context {i['context_tokens']}  [{plan['calibration']['source']}]", fontsize=9)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="center right", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(str(path))
    plt.close(fig)
