"""Thin helpers over grafana-foundation-sdk builders: one call per panel kind, house defaults applied.

Every panel reads the `$datasource` variable; every query gets a refId; legends are shown.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

with warnings.catch_warnings():
    # The classic dashboard builder warns "prefer dashboardv2" at import; the v1 JSON model is
    # still what file provisioning and @grafana/schema's `Dashboard` type describe.
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import common as cb
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.builders import heatmap, prometheus, stat, statetimeline, table, timeseries
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models import heatmap as hm
    from grafana_foundation_sdk.models import prometheus as pm

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class Q:
    """One panel query: PromQL, legend, and whether it is an instant/table query."""

    expr: str
    legend: str = "__auto"
    instant: bool = False
    table: bool = False


def _targets(queries: Sequence[Q], heatmap_format: bool = False):
    out = []
    for i, q in enumerate(queries):
        t = prometheus.Dataquery().expr(q.expr).ref_id(REF_IDS[i]).legend_format(q.legend)
        t = t.instant() if q.instant or q.table else t.range()
        if q.table:
            t = t.format(pm.PromQueryFormat.TABLE)
        elif heatmap_format:
            t = t.format(pm.PromQueryFormat.HEATMAP)
        out.append(t)
    return out


def thresholds(*steps: tuple[float | None, str]):
    return (db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=v, color=c) for v, c in steps]))


def _legend(table_mode: bool = False, calcs: Sequence[str] = ()):
    lg = (cb.VizLegendOptions().show_legend(True).placement(cm.LegendPlacement.BOTTOM)
          .display_mode(cm.LegendDisplayMode.TABLE if table_mode else cm.LegendDisplayMode.LIST)
          .calcs(list(calcs)))
    return lg


def ts(title: str, description: str, queries: Sequence[Q], unit: str = "short", *, w: int = 12, h: int = 8,
       steps: Sequence[tuple[float | None, str]] = (), min_val: float | None = None,
       max_val: float | None = None, stack: bool = False, legend_calcs: Sequence[str] = ("mean", "max", "lastNotNull")):
    p = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE)
         .targets(_targets(queries)).unit(unit).span(w).height(h)
         .legend(_legend(True, legend_calcs))
         .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
         .fill_opacity(10).line_width(1).show_points(cm.VisibilityMode.NEVER))
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    if steps:
        p = (p.thresholds(thresholds(*steps))
             .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED)))
    if stack:
        p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(40)
    return p


def stat_panel(title: str, description: str, queries: Sequence[Q], unit: str = "short", *, w: int = 4, h: int = 4,
               steps: Sequence[tuple[float | None, str]] = ((None, "blue"),), decimals: float | None = None):
    p = (stat.Panel().title(title).description(description).datasource(DATASOURCE)
         .targets(_targets(queries)).unit(unit).span(w).height(h)
         .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
         .graph_mode(cm.BigValueGraphMode.AREA).color_mode(cm.BigValueColorMode.VALUE)
         .thresholds(thresholds(*steps)))
    if decimals is not None:
        p = p.decimals(decimals)
    return p


def heat(title: str, description: str, query: Q, y_unit: str = "short", *, w: int = 12, h: int = 8):
    return (heatmap.Panel().title(title).description(description).datasource(DATASOURCE)
            .targets(_targets([query], heatmap_format=True)).span(w).height(h)
            .calculate(False)
            .rows_frame(heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.LE))
            .y_axis(heatmap.YAxisConfig().unit(y_unit))
            .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges")
                   .scale(hm.HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64))
            .cell_values(heatmap.CellValues().unit("short"))
            .tooltip(heatmap.HeatmapTooltip().mode(cm.TooltipDisplayMode.SINGLE).y_histogram(True)))


def state_timeline(title: str, description: str, queries: Sequence[Q], *, w: int = 12, h: int = 8):
    mapping = dm.ValueMap(options={
        "0": dm.ValueMappingResult(text="inactive", color="green", index=0),
        "1": dm.ValueMappingResult(text="active", color="red", index=1),
    })
    return (statetimeline.Panel().title(title).description(description).datasource(DATASOURCE)
            .targets(_targets(queries)).span(w).height(h).mappings([mapping])
            .thresholds(thresholds((None, "green"), (1, "red")))
            .show_value(cm.VisibilityMode.NEVER).merge_values(True)
            .fill_opacity(70).line_width(0))


def table_panel(title: str, description: str, queries: Sequence[Q], *, w: int = 24, h: int = 8,
                rename: dict[str, str] | None = None, units: dict[str, str] | None = None):
    """Instant queries in table format, merged on their labels: one row per label set."""
    p = (table.Panel().title(title).description(description).datasource(DATASOURCE)
         .targets(_targets(queries)).span(w).height(h)
         .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
         .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
             "excludeByName": {"Time": True},
             "renameByName": dict(rename or {}),
         })))
    for field, unit in sorted((units or {}).items()):
        p = p.override_by_name(field, [dm.DynamicConfigValue(id_val="unit", value=unit)])
    return p


def text_row(title: str, collapsed: bool = False, repeat: str | None = None):
    r = db.Row(title).collapsed(collapsed)
    if repeat:
        r = r.repeat(repeat)
    return r


def variables(instance_source: str, model_source: str):
    """Template variables: data source, model (multi, All) and instance (multi, All, by model)."""
    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        (db.QueryVariable("model").label("Model").datasource(DATASOURCE)
         .query(f"label_values({model_source}, model_name)")
         .multi(True).include_all(True).all_value(".*")
         .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)),
        (db.QueryVariable("instance").label("Instance").datasource(DATASOURCE)
         .query(f'label_values({instance_source}{{model_name=~"$model"}}, instance)')
         .multi(True).include_all(True).all_value(".*")
         .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)),
    ]


def new_dashboard(uid: str, title: str, description: str, tags: Sequence[str]):
    return (db.Dashboard(title).uid(uid).description(description).tags(list(tags))
            .editable().refresh("30s").time("now-1h", "now").timezone("browser")
            .tooltip(dm.DashboardCursorSync.CROSSHAIR))


def links_to_siblings():
    """A drop-down of the other vllm-spark dashboards, carrying the time range and variables."""
    return [db.DashboardLink("vLLM on Spark").type(dm.DashboardLinkType.DASHBOARDS).tags(["vllm-spark"])
            .as_dropdown(True).include_vars(True).keep_time(True)]
