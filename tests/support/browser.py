"""Headless Chromium for report tests (Debian's `chromium-headless-shell`): screenshots of a page
at a given window size."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from PIL import Image

CHROMIUM_CANDIDATES = ("chromium-headless-shell", "/usr/lib/chromium/headless_shell",
                       "/usr/lib/chromium/chromium-headless-shell", "chromium", "chromium-browser")


def chromium() -> str:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name) or (name if Path(name).is_file() else None)
        if path:
            return path
    raise AssertionError("headless Chromium not found: install the Debian package chromium-headless-shell "
                         f"(looked for {', '.join(CHROMIUM_CANDIDATES)})")


def screenshot(html: Path, png: Path, tmp: Path, width: int = 1200, height: int = 2400) -> Image.Image:
    """The page as a `width` x `height` window shows it (no scrollbars; what lies past the window is cut)."""
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={tmp / 'chromium-profile'}", f"--window-size={width},{height}",
           f"--screenshot={png}", html.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    return Image.open(png).convert("RGB")
