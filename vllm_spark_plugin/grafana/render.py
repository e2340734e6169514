"""Deterministic serialisation: the same inputs give byte-identical files.

JSON: sorted keys, 2-space indent, trailing newline.  YAML: keys in the order given (a rule reads
record/alert, expr, for, labels, annotations), multi-line PromQL as literal blocks.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml


def dashboard_json(d: dict) -> str:
    return json.dumps(d, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


class _RulesDumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, data: str):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_RulesDumper.add_representer(str, _str_representer)


def rules_yaml(doc: dict, header: str = "") -> str:
    body = yaml.dump(doc, Dumper=_RulesDumper, sort_keys=False, default_flow_style=False,
                     width=1_000_000, allow_unicode=True)
    head = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines()) if header else ""
    return head + body


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path`; False when the file already held exactly that text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True
