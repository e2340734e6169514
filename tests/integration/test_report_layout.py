"""report.html reads on a 1280 px and an 800 px wide page without horizontal scrolling: a real report
of a short sweep against the session's CPU vLLM server (its real recipe settings in the Servers
table), rendered by headless Chromium at 1280 px, has nothing drawn at the right edge of the window;
and the report of an adaptive sweep with a latency SLO (its widest tables) has, at both widths,
nothing past the edge, no table cell clipping its text and no two blocks overlapping."""
from __future__ import annotations

import html
import json
import re

import pytest
from PIL import Image
from support.browser import screenshot
from support.layout import assert_reads_at, layout

from vllm_spark_plugin.cli import main as vllm_spark
from vllm_spark_plugin.testbed.fake_server import FakeConfig, FakeServer

PAGE_WIDTH = 1280
PAGE_HEIGHT = 8000  # taller than the whole report: everything is in the shot
EDGE = 1200  # the report's body is at most 1100 px wide (+ 24 px margin); nothing belongs past this


def ink_columns(img: Image.Image, x0: int) -> int:
    """Pixels right of x0 that are not page background (white)."""
    strip = img.crop((x0, 0, img.size[0], img.size[1]))
    return sum(n for n, c in strip.getcolors(1 << 24) or [] if sum(c) < 750)


def last_ink_row(img: Image.Image) -> int:
    gray = img.convert("L").point(lambda v: 255 if v < 250 else 0)
    box = gray.getbbox()
    return box[3] if box else 0


@pytest.mark.server
def test_report_fits_a_1280px_page(vllm_server, tmp_path):
    out = tmp_path / "run"
    assert vllm_spark(["bench", "--quiet", "--endpoint", vllm_server.base_url, "--model", vllm_server.model,
                       "--levels", "1,2", "--trials", "1", "--workload", "prose", "--output-tokens", "16",
                       "--out", str(out)]) == 0
    recipe = json.loads((out / "summary.json").read_text())["servers"][0]["recipe"]
    assert recipe.count(";") >= 4, recipe  # the settings the server reports, as one unbroken string
    page = out / "report.html"
    text = page.read_text()
    for setting in recipe.split(";"):  # shown one per line
        assert f"<li>{html.escape(setting)}</li>" in text, setting

    for width in (PAGE_WIDTH, 800):
        assert_reads_at(page, width, tmp_path)
    img = screenshot(page, tmp_path / "report.png", tmp_path, width=PAGE_WIDTH, height=PAGE_HEIGHT)
    assert img.size[0] == PAGE_WIDTH
    assert last_ink_row(img) < PAGE_HEIGHT - 300, "the report is longer than the screenshot"
    assert ink_columns(img, EDGE) == 0, "something runs off the right of a 1280 px page"

    # The check sees the fault it is for: the same report with the recipe as one unbroken line
    wide = re.sub(r"<ul class='settings'>.*?</ul>", html.escape(recipe), text).replace('<div class="servers">', "<div>")
    assert wide.count(html.escape(recipe)) == 1
    (tmp_path / "wide.html").write_text(wide)
    assert ink_columns(screenshot(tmp_path / "wide.html", tmp_path / "wide.png", tmp_path,
                                  width=PAGE_WIDTH, height=PAGE_HEIGHT), EDGE) > 0


def test_adaptive_report_reads_at_1280_and_800_px(tmp_path):
    """The adaptive search's report (points chosen close together, the search's tables) with the SLO
    columns: nothing cut off or overlapping at either width; the same page with a table forced wider
    than the window is caught."""
    srv = FakeServer(FakeConfig(alpha=0.005, beta=0.0005)).start()
    try:
        out = tmp_path / "auto"
        assert vllm_spark(["bench", "--quiet", "--endpoint", srv.base_url, "--levels", "auto", "--trials", "2",
                           "--workload", "prose", "--output-tokens", "16", "--floor", "60", "--slo-ttft", "0.05",
                           "--out", str(out)]) == 0
    finally:
        srv.stop()
    page = out / "report.html"
    text = page.read_text()
    assert "How the levels were chosen" in text and "SLO attainment %" in text
    for width in (PAGE_WIDTH, 800):
        assert_reads_at(page, width, tmp_path)
    wide = tmp_path / "wide.html"
    wide.write_text(text.replace("<table>", "<table style='min-width:1000px'>", 1))
    assert layout(wide, 800, tmp_path)["cut"], "a table wider than the window went unnoticed"
