"""Prometheus recording and alerting rules, generated from the same SLOs as the dashboards.

Recording rules are named `level:metric:operations` (Prometheus naming practice):

* `instance:` keeps `job, instance, model_name` (one vLLM server serves one model); engines are
  summed (counters, running, waiting, KV) or maxed (knee ratio, fit parameters);
* `job:` keeps `job, model_name`: the fleet.

SLO alerts follow the multiwindow, multi-burn-rate recipe of the SRE workbook (chapter 5): page when
2% of the 30-day budget burns in 1 h (14.4x, confirmed over 5 m) or 5% in 6 h (6x, confirmed over
30 m); ticket when 10% burns in 3 d (1x, confirmed over 6 h).  Error ratios are computed from
histogram buckets, exactly: the server adds its floors and TTFT SLO to the histograms' bucket
bounds, so a rule generated with the same values selects a bucket that exists (see slo.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from vllm_spark_plugin.grafana import promql as q
from vllm_spark_plugin.grafana.slo import SLOConfig
from vllm_spark_plugin.metrics import names as N

INST = "job, instance, model_name"
HOST = "job, instance"           # host series (GPU, unified memory, PSI, plugin errors) have no model_name
ON_INST = f"on ({INST})"
FLEET = "job, model_name"
PREFILL = 'phase="prefill"'
WINDOW_SECONDS = {"2m": 120, "5m": 300, "10m": 600, "30m": 1800, "1h": 3600, "6h": 21600, "3d": 259200}
SLOW_STATE_FACTOR = 1.5          # observed mean step time over the model's prediction
PREFILL_STALL_TOKENS_PER_STEP = 1024
PREFILL_STALL_STEP_JUMP = 2.0    # 2-minute mean step time over its 1-hour mean
KV_USAGE_HIGH = 0.95
MEMORY_AVAILABLE_LOW = 0.05      # share of unified memory still available
MEMORY_PSI_HIGH = 0.10           # share of time some task stalled on memory (PSI some avg60)
MEMORY_HEADROOM_LOW = 0.10       # (MemFree + reclaimable) / MemTotal: what a new allocation can still get
MEMORY_PSI_FULL_HIGH = 0.05      # share of time all non-idle tasks stalled on memory (PSI full avg60)
LINK_STEP_MARGIN = 1.25          # mean step time over its baseline (profile, else the fit an hour ago)
LINK_FLAP_WINDOW = "15m"
LINK = "job, instance, interface"  # link series are host series, one per selected interface


def num(x: float) -> str:
    """A PromQL number literal without float noise (14.4 * (1 - 0.99) -> 0.144)."""
    return f"{round(x, 12):.12g}"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    severity: str            # critical = page, warning = ticket, info = look when convenient
    summary: str
    description: str
    for_: str = "0m"
    extra_labels: dict = field(default_factory=dict)

    def to_rule(self, slo: SLOConfig) -> dict:
        rule: dict = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0m":
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity, **self.extra_labels}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": runbook_url(self.name, slo),
        }
        return rule


def runbook_url(alert: str, slo: SLOConfig) -> str:
    base = slo.runbook_base_url
    if base and not base.endswith("/"):
        base += "/"
    return f"{base}{alert}.md"


# ---------------------------------------------------------------------------------------------
def _ratio_record(name: str, expr: str) -> dict:
    return {"record": name, "expr": expr}


def recording_groups(slo: SLOConfig) -> list[dict]:
    r = q.rate
    instance = [
        _ratio_record("instance:vllm_spark_generation_tokens:rate1m", f"sum by ({INST}) ({r(N.GENERATION_TOKENS, '1m')})"),
        _ratio_record("instance:vllm_spark_generation_tokens:rate5m", f"sum by ({INST}) ({r(N.GENERATION_TOKENS, '5m')})"),
        _ratio_record("instance:vllm_spark_running_requests:sum", f"sum by ({INST}) ({N.RUNNING})"),
        _ratio_record("instance:vllm_spark_waiting_requests:sum", f"sum by ({INST}) ({N.WAITING})"),
        _ratio_record("instance:vllm_spark_knee_ratio:max", f"max by ({INST}) ({N.KNEE_RATIO})"),
        _ratio_record("instance:vllm_spark_knee_batch_size:sum", f"sum by ({INST}) ({N.KNEE_BATCH})"),
        _ratio_record("instance:vllm_spark_capacity_streams:sum", f"sum by ({INST}, floor) ({N.CAPACITY_STREAMS})"),
        _ratio_record("instance:vllm_spark_stream_decode_tokens_per_second:p50_5m",
                      q.hist_quantile(0.5, N.STREAM_RATE, "5m", INST)),
        _ratio_record("instance:vllm_spark_ttft_seconds:p99_5m", q.hist_quantile(0.99, N.TTFT, "5m", INST)),
        _ratio_record("instance:vllm_spark_kv_blocks:usage_ratio",
                      f"sum by ({INST}) ({N.KV_BLOCKS_USED}) / sum by ({INST}) ({N.KV_BLOCKS_TOTAL})"),
        _ratio_record("instance:vllm_spark_unified_memory:available_ratio",
                      f'max by ({HOST}) ({N.UNIFIED_MEMORY}{{kind="available"}}) / max by ({HOST}) ({N.UNIFIED_MEMORY}{{kind="total"}})'),
        _ratio_record("instance:vllm_spark_memory_pressure:some_avg60",
                      f"max by ({HOST}) ({q.sel(N.MEMORY_PRESSURE, *q.PSI_SOME_60)})"),
        _ratio_record("instance:vllm_spark_gpu_energy_joules_per_token:rate5m",
                      f"sum by ({HOST}) ({r(N.GPU_ENERGY, '5m')}) / sum by ({HOST}) ({r(N.GENERATION_TOKENS, '5m')})"),
        _ratio_record("instance:vllm_spark_gpu_throttle:active",
                      f'max by ({HOST}) ({N.GPU_CLOCK_EVENT}{{reason=~"{q.THROTTLE_REASON_RE}"}})'),
    ]
    for w in ("2m", "10m", "1h"):
        instance.append(_ratio_record(f"instance:vllm_spark_step_duration_seconds:mean{w}", q.hist_mean(N.STEP_DURATION, w, INST)))
    for w in ("2m", "10m"):
        instance.append(_ratio_record(f"instance:vllm_spark_step_batch_size:mean{w}", q.hist_mean(N.STEP_BATCH_SIZE, w, INST)))
        instance.append(_ratio_record(
            f"instance:vllm_spark_step_prefill_tokens:per_step_{w}",
            f"sum by ({INST}) ({r(N.STEP_TOKENS + '_sum', w, PREFILL)}) / "
            f"sum by ({INST}) ({r(N.STEP_DURATION + '_count', w)})"))
    # tokens the streams gained, not decode tokens scheduled: with speculative decoding those include
    # the rejected drafts verified in each step (docs/speculative.md)
    instance.append(_ratio_record(
        "instance:vllm_spark_generation_tokens:per_stream_rate2m",
        f"sum by ({INST}) ({r(N.GENERATION_TOKENS, '2m')}) / "
        f"instance:vllm_spark_step_batch_size:mean2m"))
    instance.append(_ratio_record(
        "instance:vllm_spark_step_duration_seconds:predicted_by_fit_1h_ago",
        f"max by ({INST}) ({N.STEP_ALPHA} offset 1h)\n"
        f"+ max by ({INST}) ({N.STEP_BETA} offset 1h) * instance:vllm_spark_step_batch_size:mean10m"))

    ttft_le = 'le="' + q.le(slo.ttft_slo_seconds) + '"'
    rate_le = 'le="' + q.le(slo.floor_tokens_per_second) + '"'
    slo_rules = []
    for w in ("5m", "30m", "1h", "6h", "3d"):
        slo_rules.append(_ratio_record(
            f"instance:vllm_spark_ttft_slo_errors:ratio_rate{w}",
            f"1 - (\n  sum by ({INST}) ({r(N.TTFT + '_bucket', w, ttft_le)})\n"
            f"  /\n  sum by ({INST}) ({r(N.TTFT + '_count', w)})\n)"))
        slo_rules.append(_ratio_record(
            f"instance:vllm_spark_stream_rate_slo_errors:ratio_rate{w}",
            f"sum by ({INST}) ({r(N.STREAM_RATE + '_bucket', w, rate_le)})\n"
            f"/\nsum by ({INST}) ({r(N.STREAM_RATE + '_count', w)})"))
    for w in ("1h", "6h", "3d"):
        slo_rules.append(_ratio_record(f"instance:vllm_spark_ttft_requests:rate{w}", f"sum by ({INST}) ({r(N.TTFT + '_count', w)})"))
        slo_rules.append(_ratio_record(f"instance:vllm_spark_stream_rate_requests:rate{w}", f"sum by ({INST}) ({r(N.STREAM_RATE + '_count', w)})"))

    fleet = [
        _ratio_record("job:vllm_spark_capacity_streams:sum", f"sum by ({FLEET}, floor) ({N.CAPACITY_STREAMS})"),
        _ratio_record("job:vllm_spark_knee_ratio:running_over_knee",
                      f"sum by ({FLEET}) ({N.RUNNING}) / sum by ({FLEET}) ({N.KNEE_BATCH})"),
        _ratio_record("job:vllm_spark_generation_tokens:rate5m", f"sum by ({FLEET}) (instance:vllm_spark_generation_tokens:rate5m)"),
        _ratio_record("job:vllm_spark_running_requests:sum", f"sum by ({FLEET}) (instance:vllm_spark_running_requests:sum)"),
    ]
    return [
        {"name": "vllm_spark_instance", "rules": instance},
        {"name": "vllm_spark_slo", "rules": slo_rules},
        {"name": "vllm_spark_fleet", "rules": fleet},
        {"name": "vllm_spark_slo_attainment", "rules": attainment_records(slo)},
        {"name": "vllm_spark_memory", "rules": memory_records()},
        {"name": "vllm_spark_spec_decode", "rules": spec_decode_records()},
        {"name": "vllm_spark_links", "rules": link_records()},
    ]


def attainment_records(slo: SLOConfig) -> list[dict]:
    """Attainment and goodput at the configured floor from the per-request SLO counters (exact: each
    request was judged when it finished), and capacity under both SLOs with the spare streams."""
    r = q.rate
    fm = q.floor_matcher(slo.floor_tokens_per_second)
    met = 'outcome="met"'
    out = []
    for w in ("5m", "30m", "1h", "6h", "3d"):
        out.append(_ratio_record(
            f"instance:vllm_spark_attainment_slo_errors:ratio_rate{w}",
            f"1 - (\n  sum by ({INST}) ({r(N.SLO_REQUESTS, w, fm, met)})\n"
            f"  /\n  sum by ({INST}) ({r(N.SLO_REQUESTS, w, fm)})\n)"))
    for w in ("1h", "6h", "3d"):
        out.append(_ratio_record(f"instance:vllm_spark_attainment_requests:rate{w}",
                                 f"sum by ({INST}) ({r(N.SLO_REQUESTS, w, fm)})"))
    out += [
        _ratio_record("instance:vllm_spark_slo_attainment:ratio_rate5m",
                      f"sum by ({INST}, floor) ({r(N.SLO_REQUESTS, '5m', met)})\n/\n"
                      f"sum by ({INST}, floor) ({r(N.SLO_REQUESTS, '5m')})"),
        _ratio_record("instance:vllm_spark_goodput_tokens:rate5m",
                      f"sum by ({INST}, floor) ({r(N.SLO_OUTPUT_TOKENS, '5m', met)})"),
        _ratio_record("instance:vllm_spark_slo_capacity_streams:sum", f"sum by ({INST}, floor) ({N.SLO_CAPACITY})"),
        _ratio_record("instance:vllm_spark_spare_capacity_streams:sum", f"sum by ({INST}, floor) ({N.SPARE_CAPACITY})"),
        _ratio_record("job:vllm_spark_goodput_tokens:rate5m",
                      f"sum by ({FLEET}, floor) (instance:vllm_spark_goodput_tokens:rate5m)"),
        _ratio_record("job:vllm_spark_spare_capacity_streams:sum",
                      f"sum by ({FLEET}, floor) (instance:vllm_spark_spare_capacity_streams:sum)"),
    ]
    return out


def spec_decode_records() -> list[dict]:
    """Speculative decoding, from vLLM's own counters (`vllm:spec_decode_*`: present only on a server
    with `--speculative-config`) and the plugin's tokens per stream-step (any server: 1 without
    speculation).  Acceptance rate = accepted draft tokens / draft tokens; mean accepted length =
    1 + accepted draft tokens / drafts, the tokens a stream gains per verification (vLLM's own
    "mean acceptance length"); per position: accepted at draft position i / drafts."""
    acc = f"rate({q.vllm('spec_decode_num_accepted_tokens_total')}[5m])"
    drafts = f"rate({q.vllm('spec_decode_num_drafts_total')}[5m])"
    return [
        _ratio_record("instance:vllm_spark_spec_decode_acceptance:ratio_rate5m",
                      f"sum by ({INST}) ({acc})\n/\n"
                      f"sum by ({INST}) (rate({q.vllm('spec_decode_num_draft_tokens_total')}[5m]))"),
        _ratio_record("instance:vllm_spark_spec_decode_accepted_length:mean5m",
                      f"1 + sum by ({INST}) ({acc})\n/\nsum by ({INST}) ({drafts})"),
        _ratio_record("instance:vllm_spark_spec_decode_acceptance_by_position:ratio_rate5m",
                      f"sum by ({INST}, position) (rate({q.vllm('spec_decode_num_accepted_tokens_per_pos_total')}[5m]))\n"
                      f"/ {ON_INST} group_left\nsum by ({INST}) ({drafts})"),
        _ratio_record("instance:vllm_spark_step_tokens_per_stream:mean5m",
                      f"sum by ({INST}) ({q.rate(N.GENERATION_TOKENS, '5m')})\n/\n"
                      f"sum by ({INST}) ({q.rate(N.STEP_BATCH_SIZE + '_sum', '5m')})"),
    ]


# ---------------------------------------------------------------------------------------------
def _burn(metric: str, requests: str, budget: float, pairs, min_requests: int) -> str:
    arms = []
    for factor, long_w, short_w in pairs:
        thr = num(factor * budget)
        arms.append(
            f"(\n  instance:vllm_spark_{metric}_slo_errors:ratio_rate{long_w} > {thr}\n"
            f"  and {ON_INST}\n  instance:vllm_spark_{metric}_slo_errors:ratio_rate{short_w} > {thr}\n"
            f"  and {ON_INST}\n  instance:vllm_spark_{requests}_requests:rate{long_w} * {WINDOW_SECONDS[long_w]} >= {min_requests}\n)")
    return "\nor\n".join(arms)


FAST = ((14.4, "1h", "5m"), (6.0, "6h", "30m"))
SLOW = ((1.0, "3d", "6h"),)


def alerts(slo: SLOConfig) -> list[tuple[str, list[Alert]]]:
    ttft_budget = 1 - slo.ttft_slo_target
    rate_budget = 1 - slo.rate_slo_target
    floor = slo.floor_tokens_per_second
    ttft = slo.ttft_slo_seconds
    fm = q.floor_matcher(floor)
    job = slo.job
    mr = slo.min_requests

    slo_alerts = [
        Alert("VllmSparkTTFTBudgetBurnFast", _burn("ttft", "ttft", ttft_budget, FAST, mr), "critical",
              f"TTFT SLO ({num(slo.ttft_slo_target * 100)}% <= {ttft:g} s) is burning its error budget fast on {{{{ $labels.instance }}}}",
              f"{{{{ $value | humanizePercentage }}}} of requests to {{{{ $labels.model_name }}}} on {{{{ $labels.instance }}}} waited longer than "
              f"{ttft:g} s for their first token (budget {num(ttft_budget * 100)}%): at 14.4x over 1 h (and 5 m) or 6x over 6 h (and 30 m) "
              f"the 30-day budget is gone in days. Ignored below {mr} requests in the long window.", "2m"),
        Alert("VllmSparkTTFTBudgetBurnSlow", _burn("ttft", "ttft", ttft_budget, SLOW, mr), "warning",
              f"TTFT SLO ({num(slo.ttft_slo_target * 100)}% <= {ttft:g} s) has burned its budget for 3 days on {{{{ $labels.instance }}}}",
              f"The share of requests slower than {ttft:g} s to first token has exceeded the {num(ttft_budget * 100)}% budget over 3 days "
              f"and the last 6 hours ({{{{ $value | humanizePercentage }}}}). Ignored below {mr} requests in 3 days.", "15m"),
        Alert("VllmSparkStreamRateBudgetBurnFast", _burn("stream_rate", "stream_rate", rate_budget, FAST, mr), "critical",
              f"Per-stream decode-rate SLO ({num(slo.rate_slo_target * 100)}% > {floor:g} tok/s) is burning fast on {{{{ $labels.instance }}}}",
              f"{{{{ $value | humanizePercentage }}}} of finished requests on {{{{ $labels.instance }}}} decoded at or below {floor:g} tok/s "
              f"per stream (budget {num(rate_budget * 100)}%), at 14.4x over 1 h (and 5 m) or 6x over 6 h (and 30 m). "
              f"Ignored below {mr} requests in the long window.", "2m"),
        Alert("VllmSparkStreamRateBudgetBurnSlow", _burn("stream_rate", "stream_rate", rate_budget, SLOW, mr), "warning",
              f"Per-stream decode-rate SLO ({num(slo.rate_slo_target * 100)}% > {floor:g} tok/s) has burned its budget for 3 days on {{{{ $labels.instance }}}}",
              f"The share of requests at or below {floor:g} tok/s per stream has exceeded the {num(rate_budget * 100)}% budget over 3 days "
              f"and the last 6 hours ({{{{ $value | humanizePercentage }}}}).", "15m"),
    ]

    serving_alerts = [
        Alert("VllmSparkPastKnee",
              f"instance:vllm_spark_knee_ratio:max > {num(slo.knee_crit)}\n"
              f"and {ON_INST}\ninstance:vllm_spark_stream_decode_tokens_per_second:p50_5m < {num(floor)}",
              "warning",
              "{{ $labels.instance }} serves past its knee with per-stream rate under the floor",
              f"Running batch / knee is {{{{ $value | printf \"%.2f\" }}}} (> {slo.knee_crit:g}) on {{{{ $labels.instance }}}} and the median "
              f"per-stream decode rate over 5 m is below {floor:g} tok/s: extra streams cost every user speed and add little throughput.",
              "10m"),
        Alert("VllmSparkApproachingKnee",
              f"instance:vllm_spark_knee_ratio:max > {num(slo.knee_warn)}", "info",
              "{{ $labels.instance }} runs near its knee",
              f"Running batch / knee is {{{{ $value | printf \"%.2f\" }}}} (> {slo.knee_warn:g}) for 30 m on {{{{ $labels.instance }}}}: "
              "little throughput headroom is left before per-stream rates fall fast.", "30m"),
        Alert("VllmSparkCapacityExhausted",
              f"instance:vllm_spark_running_requests:sum\n>= {ON_INST}\ninstance:vllm_spark_slo_capacity_streams:sum{{{fm}}}\n"
              f"and {ON_INST}\ninstance:vllm_spark_waiting_requests:sum > 0",
              "warning",
              f"{{{{ $labels.instance }}}} is at its capacity under both SLOs at {floor:g} tok/s and requests are queueing",
              f"{{{{ $labels.instance }}}} runs {{{{ $value }}}} streams, at or above the live capacity under both SLOs (TTFT and "
              f"{floor:g} tok/s per stream), and requests are waiting: add a replica or shed load.", "5m"),
        Alert("VllmSparkQueueGrowing",
              "min_over_time(instance:vllm_spark_waiting_requests:sum[10m]) > 0\n"
              f"and {ON_INST}\nderiv(instance:vllm_spark_waiting_requests:sum[10m]) > 0",
              "warning",
              "The request queue on {{ $labels.instance }} has not drained for 10 minutes and is growing",
              "At least {{ $value }} requests waited throughout the last 10 m and the queue is still growing: arrivals exceed what the batch can absorb.",
              "5m"),
        Alert("VllmSparkGuardHolding",
              f"sum by ({INST}) ({N.GUARD_DEFERRED}) > 0",
              "warning",
              "The SLO guard on {{ $labels.instance }} has held requests back for 10 minutes",
              "The guard (SPARK_PLUGIN_GUARD) capped running requests at the live capacity and kept {{ $value }} requests waiting "
              "throughout the last 10 m: admitted streams keep their rate, the held ones wait (TTFT). Arrivals exceed the capacity "
              "under both SLOs: add a replica or shed load.",
              "10m"),
        Alert("VllmSparkPrefillStall",
              f"instance:vllm_spark_step_prefill_tokens:per_step_2m > {PREFILL_STALL_TOKENS_PER_STEP}\n"
              f"and {ON_INST}\n"
              f"instance:vllm_spark_step_duration_seconds:mean2m > {num(PREFILL_STALL_STEP_JUMP)} * instance:vllm_spark_step_duration_seconds:mean1h\n"
              f"and {ON_INST}\ninstance:vllm_spark_generation_tokens:per_stream_rate2m < {num(floor)}",
              "warning",
              "Long prefills on {{ $labels.instance }} are stalling decode",
              f"Over 2 m the engine scheduled {{{{ $value | printf \"%.0f\" }}}} prefill tokens per step (> {PREFILL_STALL_TOKENS_PER_STEP}), "
              f"the mean step time more than doubled against its 1 h mean, and running streams decode below {floor:g} tok/s each: "
              "long uncached prompts are starving decode.", "1m"),
        Alert("VllmSparkSlowState",
              "instance:vllm_spark_step_duration_seconds:mean10m\n"
              f"> {num(SLOW_STATE_FACTOR)} * instance:vllm_spark_step_duration_seconds:predicted_by_fit_1h_ago\n"
              f"and {ON_INST}\ninstance:vllm_spark_step_prefill_tokens:per_step_10m < 256\n"
              "unless on (job, instance)\ninstance:vllm_spark_gpu_throttle:active > 0",
              "warning",
              "{{ $labels.instance }} steps are slower than its own step-time model with no throttle reason",
              f"The mean step time over 10 m is {{{{ $value | humanizeDuration }}}}, more than {SLOW_STATE_FACTOR:g}x what the step-time model "
              "fitted an hour ago predicts for the current mean batch size, prefill is light, and no thermal or power clock-event reason is active.",
              "15m"),
    ]

    resource_alerts = [
        Alert("VllmSparkKVCachePressure", f"instance:vllm_spark_kv_blocks:usage_ratio > {num(KV_USAGE_HIGH)}", "warning",
              "KV cache on {{ $labels.instance }} is nearly full",
              f"{{{{ $value | humanizePercentage }}}} of KV blocks are in use (> {KV_USAGE_HIGH:.0%}) for 5 m: new requests queue and running ones get preempted.",
              "5m"),
        Alert("VllmSparkPreemptions", f"sum by ({INST}) (rate({N.PREEMPTIONS}[5m])) > 0", "warning",
              "{{ $labels.instance }} is preempting requests",
              "Requests are preempted at {{ $value | printf \"%.3f\" }}/s for 10 m: the KV cache cannot hold the running batch; preempted requests recompute their prefill.",
              "10m"),
        Alert("VllmSparkUnifiedMemoryLow", f"instance:vllm_spark_unified_memory:available_ratio < {num(MEMORY_AVAILABLE_LOW)}", "critical",
              "Unified memory on {{ $labels.instance }} is almost exhausted",
              f"Only {{{{ $value | humanizePercentage }}}} of the unified memory is available (< {MEMORY_AVAILABLE_LOW:.0%}): a Spark this short of memory can wedge the whole host.",
              "2m"),
        Alert("VllmSparkMemoryPressure", f"instance:vllm_spark_memory_pressure:some_avg60 > {num(MEMORY_PSI_HIGH)}", "warning",
              "Memory pressure on {{ $labels.instance }}",
              f"Some task stalled on memory {{{{ $value | humanizePercentage }}}} of the time over the last 60 s (PSI, > {MEMORY_PSI_HIGH:.0%}) for 5 m.",
              "5m"),
    ]

    exporter_alerts = [
        Alert("VllmSparkTargetDown", f'up{{job="{job}"}} == 0', "critical",
              "vLLM /metrics on {{ $labels.instance }} cannot be scraped",
              f"Prometheus has failed to scrape job {job} on {{{{ $labels.instance }}}} for 2 m: the server is down, hung or unreachable.", "2m"),
        Alert("VllmSparkTargetMissing", f'absent(up{{job="{job}"}})', "critical",
              f"No vLLM target in job {job}",
              f"Prometheus has no target for job {job} at all: the scrape configuration or service discovery lost it.", "5m"),
        Alert("VllmSparkPluginMissing",
              f'up{{job="{job}"}} == 1\nunless on (job, instance)\ngroup by (job, instance) ({N.INFO})', "warning",
              "vLLM on {{ $labels.instance }} runs without the vllm-spark plugin metrics",
              "The server answers scrapes but exports no vllm_spark_info: the plugin is not installed in this environment, "
              "VLLM_PLUGINS excludes it, or it disabled itself at start-up (see the server log).", "5m"),
        Alert("VllmSparkPluginErrors", f"sum by ({HOST}, where) (rate({N.PLUGIN_ERRORS}[5m])) > 0", "warning",
              "The vllm-spark plugin on {{ $labels.instance }} is catching errors in {{ $labels.where }}",
              "The plugin caught {{ $value | printf \"%.3f\" }} exceptions/s in {{ $labels.where }} for 5 m (vLLM keeps serving; the affected metrics may be stale).",
              "5m"),
    ]
    attainment_budget = 1 - slo.attainment_target
    both = f"TTFT <= {ttft:g} s and per-stream rate >= {floor:g} tok/s"
    attainment_alerts = [
        Alert("VllmSparkSLOAttainmentBurnFast", _burn("attainment", "attainment", attainment_budget, FAST, mr), "critical",
              f"Latency SLO attainment ({num(slo.attainment_target * 100)}% of requests with {both}) is burning fast on {{{{ $labels.instance }}}}",
              f"{{{{ $value | humanizePercentage }}}} of finished requests to {{{{ $labels.model_name }}}} on {{{{ $labels.instance }}}} missed "
              f"{both} (budget {num(attainment_budget * 100)}%): at 14.4x over 1 h (and 5 m) or 6x over 6 h (and 30 m) the 30-day "
              f"budget is gone in days. Ignored below {mr} requests in the long window.", "2m"),
        Alert("VllmSparkSLOAttainmentBurnSlow", _burn("attainment", "attainment", attainment_budget, SLOW, mr), "warning",
              f"Latency SLO attainment ({num(slo.attainment_target * 100)}% of requests with {both}) has burned its budget for 3 days on {{{{ $labels.instance }}}}",
              f"The share of finished requests missing {both} has exceeded the {num(attainment_budget * 100)}% budget over 3 days "
              f"and the last 6 hours ({{{{ $value | humanizePercentage }}}}). Ignored below {mr} requests in 3 days.", "15m"),
    ]

    return [
        ("vllm_spark_slo_alerts", slo_alerts),
        ("vllm_spark_serving_alerts", serving_alerts),
        ("vllm_spark_resource_alerts", resource_alerts),
        ("vllm_spark_exporter_alerts", exporter_alerts),
        ("vllm_spark_attainment_alerts", attainment_alerts),
        ("vllm_spark_memory_alerts", memory_alerts()),
        ("vllm_spark_link_alerts", link_alerts(slo)),
    ]


def alerting_groups(slo: SLOConfig) -> list[dict]:
    return [{"name": name, "rules": [a.to_rule(slo) for a in group]} for name, group in alerts(slo)]


def alert_names(slo: SLOConfig | None = None) -> list[str]:
    return [a.name for _, group in alerts(slo or SLOConfig()) for a in group]


RECORDING_FILE = "recording.rules.yml"
ALERTING_FILE = "alerting.rules.yml"


def render_files(slo: SLOConfig | None = None) -> dict[str, str]:
    from vllm_spark_plugin.grafana.render import rules_yaml

    slo = (slo or SLOConfig()).validate()
    header = ("Generated by `vllm-spark dashboards`; edit vllm_spark_plugin/grafana/rules.py, not this file.\n"
              f"TTFT SLO {slo.ttft_slo_seconds:g} s at {slo.ttft_slo_target:g}, per-stream floor "
              f"{slo.floor_tokens_per_second:g} tok/s at {slo.rate_slo_target:g}, knee {slo.knee_warn:g}/{slo.knee_crit:g}, "
              f"min requests {slo.min_requests}, link share {slo.link_share:g}, job {slo.job}.")
    return {
        RECORDING_FILE: rules_yaml({"groups": recording_groups(slo)}, header),
        ALERTING_FILE: rules_yaml({"groups": alerting_groups(slo)}, header),
    }


# ---------------------------------------------------------------------------------------------
def memory_records() -> list[dict]:
    """Unified-memory failure signals (metrics/memory_telemetry.py), per host."""
    return [
        _ratio_record("instance:vllm_spark_memory_headroom:ratio",
                      f'(\n  max by ({HOST}) ({N.MEMINFO}{{field="MemFree"}})\n  + max by ({HOST}) ({N.MEMORY_RECLAIMABLE})\n)\n'
                      f'/ max by ({HOST}) ({N.UNIFIED_MEMORY}{{kind="total"}})'),
        _ratio_record("instance:vllm_spark_memory_pressure:full_avg60",
                      f'max by ({HOST}) ({N.MEMORY_PRESSURE}{{kind="full", window="avg60"}})'),
        _ratio_record("instance:vllm_spark_nvrm_events:increase5m",
                      f"sum by ({HOST}, kind) (increase({N.NVRM_EVENTS}[5m]))"),
    ]


def memory_alerts() -> list[Alert]:
    return [
        Alert("VllmSparkDriverOutOfMemory", 'instance:vllm_spark_nvrm_events:increase5m{kind="nv_err_no_memory"} > 0', "warning",
              "The NVIDIA driver on {{ $labels.instance }} failed a memory allocation (NV_ERR_NO_MEMORY)",
              "The kernel log shows {{ $value | printf \"%.0f\" }} NVRM NV_ERR_NO_MEMORY line(s) in the last 5 m. On a unified-memory "
              "Spark the driver can run out while MemAvailable still shows gigabytes; a burst during a long prefill or start-up "
              "has preceded whole-host wedges."),
        Alert("VllmSparkReclaimableHeadroomLow", f"instance:vllm_spark_memory_headroom:ratio < {num(MEMORY_HEADROOM_LOW)}", "warning",
              "Free plus reclaimable memory on {{ $labels.instance }} is low",
              f"MemFree plus reclaimable page cache and slab is {{{{ $value | humanizePercentage }}}} of unified memory "
              f"(< {MEMORY_HEADROOM_LOW:.0%}) for 5 m: new GPU allocations (KV growth, CUDA graphs, a restart) may fail.",
              "5m"),
        Alert("VllmSparkMemoryPressureFull", f"instance:vllm_spark_memory_pressure:full_avg60 > {num(MEMORY_PSI_FULL_HIGH)}", "critical",
              "All tasks on {{ $labels.instance }} are stalling on memory",
              f"Every non-idle task stalled on memory {{{{ $value | humanizePercentage }}}} of the last 60 s (PSI full, "
              f"> {MEMORY_PSI_FULL_HIGH:.0%}) for 5 m: the host is thrashing and can stop responding.",
              "5m"),
    ]


# ---------------------------------------------------------------------------------------------
def link_records() -> list[dict]:
    """The interconnect (common/link_sources.py, docs/links.md): what each selected interface carried,
    and that as a share of its negotiated rate."""
    return [
        _ratio_record("instance:vllm_spark_link_bytes:rate5m", q.link_bytes_rate("5m", LINK)),
        _ratio_record("instance:vllm_spark_link_bytes:share_of_rate5m",
                      f"instance:vllm_spark_link_bytes:rate5m\n/ max by ({LINK}) ({N.LINK_RATE})"),
    ]


def link_alerts(slo: SLOConfig) -> list[Alert]:
    """The ring-bottleneck signature and link flaps.  The step-time baseline is the offline profile's line
    where the server has one (it was measured on a healthy fleet, so it also sees a fleet that came up
    degraded), else the live fit as it stood an hour ago (the current fit absorbs a lasting slowdown)."""
    share = num(slo.link_share)
    ratio = "instance:vllm_spark_link_bytes:share_of_rate5m"
    baseline = (f"    {q.profile_step_seconds('10m', INST)}\n    or\n"
                "    instance:vllm_spark_step_duration_seconds:predicted_by_fit_1h_ago")
    w = LINK_FLAP_WINDOW
    flap_kinds = 'kind=~"link_down|nic_reinit"'
    return [
        Alert("VllmSparkLinkBelowRate",
              f"{ratio} < {share}\nand {ratio} > 0\nand on (job, instance)\n"
              f"max by (job, instance) (\n  instance:vllm_spark_step_duration_seconds:mean10m\n  / (\n{baseline}\n  )\n) > {num(LINK_STEP_MARGIN)}",
              "warning",
              "Link {{ $labels.interface }} on {{ $labels.instance }} carries a fraction of its rate while steps are slow",
              f"{{{{ $labels.interface }}}} moved {{{{ $value | humanizePercentage }}}} of its negotiated rate (transmit + receive, "
              f"under {slo.link_share:.0%}) for 10 m while the engines' mean step time on {{{{ $labels.instance }}}} stayed more than "
              f"{LINK_STEP_MARGIN:g}x its baseline (the offline profile, else the step-time fit an hour ago): the signature of a "
              "ring that runs at the pace of one slow link, not of a busy one.",
              "10m"),
        Alert("VllmSparkLinkFlapping",
              f"sum by ({LINK}) (increase({N.LINK_CARRIER_CHANGES}[{w}])) > 0\n"
              f"or\nsum by ({HOST}, kind) (increase({N.LINK_EVENTS}{{{flap_kinds}}}[{w}])) > 0",
              "warning",
              "A link on {{ $labels.instance }} went down or its NIC was reinitialised",
              "{{ if $labels.interface }}{{ $labels.interface }} changed carrier state {{ $value | printf \"%.0f\" }} time(s)"
              "{{ else }}The kernel log shows {{ $value | printf \"%.0f\" }} {{ $labels.kind }} message(s){{ end }} "
              f"in the last {w.removesuffix('m')} m on {{{{ $labels.instance }}}}. A NIC that reinitialised (hot-plug) can come "
              "back at a fraction of its rate: one four-Spark ring ran at 12.5-13 Gb/s per link until a reboot with the cables "
              "connected."),
    ]
