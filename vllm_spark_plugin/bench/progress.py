"""Progress on stderr: a bar redrawn in place on a terminal, plain lines otherwise (logs, CI)."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True,
                 width: int = 28) -> None:
        self.total = max(1, total)
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self.current = ""
        self._dirty = False

    def _eta(self) -> str:
        if not self.done:
            return "--"
        left = (time.monotonic() - self.started) / self.done * (self.total - self.done)
        return f"{int(left // 60)}m{int(left % 60):02d}s"

    def start(self, what: str) -> None:
        """A unit of work begins (redrawn on a terminal; silent in plain mode)."""
        self.current = what
        if self.enabled and self.tty:
            self._draw("")

    def advance(self, result: str = "") -> None:
        """A unit of work ended: count it and show its headline result."""
        self.done = min(self.total, self.done + 1)
        if not self.enabled:
            return
        if self.tty:
            self._draw(result)
        else:
            pct = 100.0 * self.done / self.total
            self.stream.write(f"[{self.done}/{self.total} {pct:3.0f}%] {self.current}"
                              f"{': ' + result if result else ''}\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        """A message on its own line (does not disturb the bar)."""
        if not self.enabled:
            return
        if self.tty and self._dirty:
            self.stream.write("\n")
            self._dirty = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def _draw(self, result: str) -> None:
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        line = f"\r[{bar}] {self.done}/{self.total} eta {self._eta()} {self.current}"
        if result:
            line += f" | {result}"
        self.stream.write(line[:200].ljust(120))
        self.stream.flush()
        self._dirty = True

    def close(self) -> None:
        if self.enabled and self.tty and self._dirty:
            self.stream.write("\n")
            self.stream.flush()
            self._dirty = False
