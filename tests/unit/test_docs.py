"""The README stays short and its pages stay reachable: at most 200 lines, the two commands first (the
test command is the one CI runs), prose lines of at most 200 characters, every relative link and
anchor in README.md and docs/*.md resolving, and docs/index.md listing every page."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"\[[^\]\n]*(?:\n[^\]\n]*)?\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`[^`]*`")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def is_table_row(line: str) -> bool:
    return line.lstrip().startswith("|")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (no backticks, emphasis or link targets),
    lower case, punctuation dropped except hyphens and underscores, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in prose_lines(path):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link that is not an external URL; a link's text may
    wrap onto the next line."""
    prose = dict(prose_lines(path))
    lines = [CODE_SPAN.sub(lambda m: "x" * len(m.group()), prose.get(n, ""))
             for n in range(1, len(path.read_text().splitlines()) + 1)]
    text = "\n".join(lines)
    out = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # not http:, https:, mailto:
            out.append((text.count("\n", 0, m.start()) + 1, target))
    return out


def two_commands_block() -> list[str]:
    lines = README.read_text().splitlines()
    start = lines.index("## Two commands")
    fence = next(i for i in range(start, len(lines)) if FENCE.match(lines[i]))
    end = next(i for i in range(fence + 1, len(lines)) if FENCE.match(lines[i]))
    return [line.split("#")[0].strip() for line in lines[fence + 1:end] if line.strip()]


def test_readme_is_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


def test_readme_opens_with_the_two_commands():
    headings = [line for _, line in prose_lines(README) if line.startswith("## ")]
    assert headings[0] == "## Two commands", headings[:3]
    assert two_commands_block() == ["bash scripts/demo.sh", "bash scripts/test.sh"]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^\s*(exec\s+)?bash scripts/test\.sh\s*$", ci, re.MULTILINE), ci
    assert "bash scripts/test.sh" in two_commands_block()


def test_no_prose_line_is_longer_than_200_characters():
    long = [f"{path.relative_to(ROOT)}:{number} ({len(line)} characters)"
            for path in PAGES for number, line in prose_lines(path)
            if len(line) > 200 and not is_table_row(line)]
    assert not long, long


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for path in PAGES:
        for number, target in relative_links(path):
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} (no such heading in {dest.relative_to(ROOT)})")
    assert not broken, broken


def test_index_links_every_page():
    index = DOCS / "index.md"
    linked = {(index.parent / target.partition("#")[0]).resolve() for _, target in relative_links(index)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p != index and p.resolve() not in linked]
    assert not missing, missing
    assert "docs/index.md" in {target for _, target in relative_links(README)}
