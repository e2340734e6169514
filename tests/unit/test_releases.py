"""The release list (vllm_spark_plugin/vllm/releases.py) and what is derived from it: the window, the
pip requirement the docs and pyproject.toml give, what CI checks and what a release environment
leaves out.  No vLLM needed."""
from __future__ import annotations

import tomllib
from pathlib import Path

from vllm_spark_plugin.vllm import releases

ROOT = Path(__file__).resolve().parents[2]


def test_the_window_spans_the_listed_releases_and_gives_the_pip_requirement():
    minors = sorted(releases._minor(v) for v in releases.RELEASES)
    assert releases.WINDOW == (minors[0], minors[-1])
    (a, b), (c, d) = releases.WINDOW
    assert releases.vllm_requirement() == f"vllm>={a}.{b},<{c}.{d + 1}"
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    assert extra == [releases.vllm_requirement()], "pyproject.toml's vllm extra is out of step with releases.py"


def test_ci_checks_the_newest_release_and_the_oldest_served_one():
    newest = max(releases.RELEASES, key=lambda v: tuple(int(p) for p in v.split(".")))
    served = [v for v, how in releases.RELEASES.items() if how == "cpu"]
    oldest_served = min(served, key=lambda v: tuple(int(p) for p in v.split(".")))
    assert set(releases.CI_RELEASES) == {newest, oldest_served}


def test_what_a_release_environment_leaves_out_is_listed_with_its_reason():
    for version, left in releases.LEFT_OUT.items():
        assert version in releases.RELEASES
        for name, why in left.items():
            assert name != "torch", "torch is what every check imports"
            assert name in why and len(why) > 40, f"{version}: say why {name} is left out"


def test_an_install_that_would_fill_the_disk_stops_before_it_starts_and_names_the_shortfall(tmp_path):
    import subprocess
    script = ROOT / "scripts" / "need-disk.sh"
    short = subprocess.run(["bash", str(script), str(tmp_path / "env"), "1000000", "release-env[9.9.9]: vllm==9.9.9"],
                           capture_output=True, text=True)
    assert short.returncode == 1
    assert "release-env[9.9.9]: vllm==9.9.9 needs about 1000000 GB free" in short.stderr
    assert str(tmp_path / "env") in short.stderr and "GB free" in short.stderr
    room = subprocess.run(["bash", str(script), str(tmp_path / "env"), "0", "x"], capture_output=True, text=True)
    assert room.returncode == 0 and room.stderr == ""
