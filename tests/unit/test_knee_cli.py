"""`vllm-spark knee`: table, JSON, plot, and exit status 2 on unreadable input."""
from __future__ import annotations

import csv
import json

from support.knee_sweeps import HEADER, sweep_file

from vllm_spark_plugin.cli import main


def run_cli(argv, capsys):
    rc = main(["knee", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_table_per_label(tmp_path, capsys):
    rc, out, err = run_cli([sweep_file(tmp_path / "s.csv"), "--floor", "20", "--floor", "10"], capsys)
    assert rc == 0, err
    for label in ("marlin", "cutlass"):
        assert f"{label}: 2 point(s), concurrency 1-64" in out
    for row in ("verdict", "alpha (fixed cost/step)", "beta (cost per stream)", "knee K = alpha/beta",
                "plateau 1/beta", "capacity at 20 tok/s", "capacity at 10 tok/s", "R^2"):
        assert row in out


def test_json_single_label_is_one_object(tmp_path, capsys):
    rc, out, _ = run_cli([sweep_file(tmp_path / "s.csv", ("marlin",)), "--json", "--ttft-slo", "1"], capsys)
    assert rc == 0
    obj = json.loads(out)
    assert obj["label"] == "marlin"
    for key in ("alpha_seconds", "beta_seconds", "knee", "plateau_tokens_per_second", "capacity", "ci",
                "verdict", "r2", "n", "model"):
        assert key in obj
    assert obj["verdict"] == "ok" and obj["model"] == "linear"
    assert 12 <= obj["knee"] <= 30 and 600 <= obj["plateau_tokens_per_second"] <= 900
    assert obj["ttft_slo_seconds"] == 1.0
    # TTFT 0.12 s at 1 and 2 s at 64: the 1 s bound is crossed at 1 + 0.88/1.88*63 = 30.5
    assert obj["capacity_ttft_bound"] == 30


def test_json_several_labels_is_keyed_by_label(tmp_path, capsys):
    rc, out, _ = run_cli([sweep_file(tmp_path / "s.csv"), "--json", "--floor", "15"], capsys)
    assert rc == 0
    obj = json.loads(out)
    assert set(obj) == {"marlin", "cutlass"}
    assert list(obj["marlin"]["capacity"]) == ["15"]


def test_label_filter_and_unknown_label(tmp_path, capsys):
    f = sweep_file(tmp_path / "s.csv")
    rc, out, _ = run_cli([f, "--json", "--label", "cutlass"], capsys)
    assert rc == 0 and json.loads(out)["label"] == "cutlass"
    rc, _, err = run_cli([f, "--label", "nope"], capsys)
    assert rc == 2 and "no curve named 'nope'" in err


def test_plot_writes_png(tmp_path, capsys):
    png = tmp_path / "knee.png"
    rc, out, _ = run_cli([sweep_file(tmp_path / "s.csv"), "--plot", str(png)], capsys)
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in out


def test_bad_input_exits_2_with_message(tmp_path, capsys):
    missing = tmp_path / "missing.csv"
    rc, out, err = run_cli([str(missing)], capsys)
    assert rc == 2 and out == ""
    assert str(missing) in err and "no such file" in err
    garbage = tmp_path / "garbage.csv"
    garbage.write_text("x,y\n1,2\n")
    rc, _, err = run_cli([str(garbage)], capsys)
    assert rc == 2 and "unrecognised CSV columns" in err and "Traceback" not in err
    rc, _, err = run_cli([sweep_file(tmp_path / "s.csv"), "--floor", "-3"], capsys)
    assert rc == 2 and "--floor" in err


def test_fit_verdicts_are_reported_not_raised(tmp_path, capsys):
    path = tmp_path / "one.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER)
        w.writerow(["point", "lonely", "chat", 8, "", 30.0, 240.0, 0.2, 0.3])
    rc, out, _ = run_cli([str(path), "--json"], capsys)
    assert rc == 0
    assert json.loads(out)["verdict"] == "too few points"


