"""Layout of a report page in headless Chromium at a given width: what runs past the right edge, what
a table cell clips, and which blocks overlap.  The page is copied with a small script that measures
every element after load and writes the result into the DOM, which `--dump-dom` returns."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from support.browser import chromium

PROBE = """<script>
window.addEventListener('load', () => {
  const W = document.documentElement.clientWidth;
  const out = {width: W, cut: [], clipped: [], overlaps: []};
  const name = el => el.tagName.toLowerCase() + (el.className ? '.' + el.className : '');
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (!r.width && !r.height) continue;
    if (r.right > W + 0.5) out.cut.push(name(el) + ' ends at ' + Math.round(r.right));
    if ((el.tagName === 'TD' || el.tagName === 'TH') && el.scrollWidth > el.clientWidth + 1)
      out.clipped.push(el.textContent.slice(0, 60));
  }
  const blocks = Array.from(document.body.querySelectorAll('h1,h2,h3,h4,p,ul,table,img'));
  for (let i = 0; i < blocks.length; i++) for (let j = i + 1; j < blocks.length; j++) {
    const a = blocks[i], b = blocks[j];
    if (a.contains(b) || b.contains(a)) continue;
    const p = a.getBoundingClientRect(), q = b.getBoundingClientRect();
    if (p.width && q.width && p.left < q.right - 0.5 && q.left < p.right - 0.5
        && p.top < q.bottom - 0.5 && q.top < p.bottom - 0.5)
      out.overlaps.push(name(a) + ' / ' + name(b));
  }
  const pre = document.createElement('pre');
  pre.id = 'layout-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def layout(page: Path, width: int, tmp: Path) -> dict:
    """{'width', 'cut', 'clipped', 'overlaps'} of `page` in a window `width` px wide."""
    probe = page.with_name(page.stem + f".probe{width}.html")  # beside it: relative links still resolve
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               f"--user-data-dir={tmp / 'chromium-layout'}", f"--window-size={width},2000",
               "--virtual-time-budget=3000", "--dump-dom", probe.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink(missing_ok=True)
    m = re.search(r'<pre id="layout-probe">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"no layout probe in the page's DOM: {proc.stderr[-1500:]}"
    return json.loads(m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&"))


def assert_reads_at(page: Path, width: int, tmp: Path) -> None:
    out = layout(page, width, tmp)
    assert out["width"] == width, out
    assert not out["cut"], f"{page.name} at {width} px: runs past the right edge: {out['cut'][:5]}"
    assert not out["clipped"], f"{page.name} at {width} px: table cells clip their text: {out['clipped'][:5]}"
    assert not out["overlaps"], f"{page.name} at {width} px: blocks overlap: {out['overlaps'][:5]}"
