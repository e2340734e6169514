"""End to end: a sweep against the real CPU vLLM server, and the HTML report rendered in headless
Chromium (Debian's `chromium-headless-shell`) to check the plots actually show."""
from __future__ import annotations

import csv
import json
import re

import pytest
from PIL import Image

from support.browser import screenshot
from support.cores import client_core
from vllm_spark_plugin.testbed.fake_server import FakeConfig, FakeServer
from vllm_spark_plugin.cli import main as vllm_spark

MPL_BLUE = (31, 119, 180)  # matplotlib's first line colour; nothing else in the report uses it
def assert_plots_visible(img: Image.Image) -> None:
    """The plots are drawn: many colours in the plot area and matplotlib-blue data pixels."""
    w, h = img.size
    plot_area = img.crop((0, 100, w, min(h, 2000)))
    colours = plot_area.getcolors(1 << 24) or []
    assert len(colours) > 200, f"only {len(colours)} colours: the report looks blank"
    non_white = sum(n for n, c in colours if sum(c) < 720)
    assert non_white > 0.03 * plot_area.size[0] * plot_area.size[1], "almost nothing drawn"
    blue = sum(n for n, c in colours if sum(abs(a - b) for a, b in zip(c, MPL_BLUE)) < 60)
    assert blue > 300, f"only {blue} plot-line pixels: the embedded PNG plots did not render"


def test_report_renders_in_chromium(tmp_path):
    """Fast variant on the fake server: the HTML report is self-contained and shows its plots."""
    srv = FakeServer(FakeConfig(alpha=0.005, beta=0.0005)).start()
    try:
        out = tmp_path / "fake"
        assert vllm_spark(["bench", "--quiet", "--endpoint", srv.base_url, "--levels", "1,2,4,8", "--trials", "1",
                           "--workload", "prose", "--output-tokens", "20", "--out", str(out)]) == 0
    finally:
        srv.stop()
    html = (out / "report.html").read_text()
    assert not re.findall(r'(?:src|href)="(?!data:)', html), "the report loads external resources"
    assert html.count('src="data:image/png;base64,') == 3
    assert_plots_visible(screenshot(out / "report.html", tmp_path / "shot.png", tmp_path))
    # and a page without its images is caught by the same check
    blank = tmp_path / "blank.html"
    blank.write_text(html.replace('src="data:image/png;base64,', 'data-x="'))
    with pytest.raises(AssertionError):
        assert_plots_visible(screenshot(blank, tmp_path / "blank.png", tmp_path))


@pytest.mark.server
def test_sweep_against_cpu_vllm_server(vllm_server, tmp_path):
    out = tmp_path / "e2e"
    with client_core(vllm_server) as own_core:  # the sweep's client times streams: a core of its own
        rc = vllm_spark(["bench", "--quiet", "--endpoint", vllm_server.base_url, "--model", vllm_server.model,
                         "--levels", "1,2,4,8,16", "--trials", "2", "--workload", "prose", "--output-tokens", "32",
                         "--out", str(out)])
    assert own_core, "the client could not get a core of its own"
    assert rc == 0
    with open(out / "sweep.csv", newline="") as fh:
        data = list(csv.DictReader(fh))
    points = [r for r in data if r["row_type"] == "point"]
    assert [int(p["concurrency"]) for p in points] == [1, 2, 4, 8, 16]
    assert sum(r["row_type"] == "trial" for r in data) == 10
    import vllm
    for p in points:
        c = int(p["concurrency"])
        assert int(p["completed"]) == int(p["requests"]) == 2 * c and int(p["errors"]) == 0
        assert int(p["short_streams"]) == 0 and int(p["output_tokens"]) == 2 * c * 32  # ignore_eos honoured
        assert float(p["ttft_p50_s"]) > 0 and float(p["output_tps"]) > 0
        assert p["engine_version"] == vllm.__version__ and p["max_model_len"] == "2048"
        # every stream has a decode timing, or is flagged: on a loaded 2-core box the CPU server
        # sometimes delivers a whole short stream in one burst (see docs/bench.md)
        if int(p["bunched_streams"]) < int(p["completed"]):
            assert float(p["per_stream_median_tps"]) > 0 and float(p["aggregate_tps"]) > 0
        else:
            assert p["per_stream_median_tps"] == ""
    rate = {int(p["concurrency"]): float(p["per_stream_median_tps"]) for p in points if p["per_stream_median_tps"]}
    assert len(rate) >= 2, f"too few points with stream timings: {rate}"
    # Not gated: that each stream slows as the batch grows.  The tiny model's step is nearly flat up to
    # 16 streams, so the per-stream medians at 1 and 16 are within the box's drift of each other
    # (156 and 177 tok/s in a clean-clone run, 127 at 2): two wall-clock readings raced on shared cores.
    # The work done per second rises ~15x, far past the drift:
    out_tps = {int(p["concurrency"]): float(p["output_tps"]) for p in points}
    assert out_tps[16] > 2 * out_tps[1], out_tps
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["servers"][0]["engine_version"]
    assert summary["servers"][0]["cache_config"], "vllm:cache_config_info not read from /metrics"
    profile = json.loads((out / "capacity_profile.json").read_text())
    assert profile["model"] == vllm_server.model and "20" in profile["capacity"]
    for name in ("aggregate.png", "per_stream.png", "ttft.png", "report.html", "meta.json"):
        assert (out / name).stat().st_size > 1000, name
    assert_plots_visible(screenshot(out / "report.html", tmp_path / "shot.png", tmp_path))
