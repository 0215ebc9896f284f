"""`foscar-bench targets`: the scorecard printed from a store, its JSON, --fail-on-miss's exit codes
(1 on a missed target; a target not measured does not fail), bad input as one line naming the
value (exit 2), and the bundled store."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reports import paper
from suite.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reports"))
import targets_records as tr  # noqa: E402  (tests/reports/targets_records.py)

runner = CliRunner()
BUNDLED = Path(__file__).resolve().parents[2] / "reports" / "data" / "bundled.sqlite"
N_TARGETS = len(paper.targets())


def invoke(args: list[str]):
    res = runner.invoke(app, ["targets", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res


def one_line(args: list[str], code: int) -> str:
    res = invoke(args)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == code and len(lines) == 1, res.output
    return lines[0]


def met_everywhere() -> list[dict]:
    """The fixture grid with INT2's figures raised to meet its goals too."""
    return tr.grid(change={("foscar-int2", 128, 32768): {"frac": 0.90, "alu": 0.60},
                           ("foscar-int2", 1, 131072): {"frac": 0.85}})


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """'missed': INT2 misses its bandwidth and ALU goals; 'met': every goal met; 'unmeasured': every
    goal met or not measured, the batch-1 / 128K records of ours having crashed; the run of each store
    named 'grid-1' at commit aaaa1111, 'met' holding a later 'grid-2' too."""
    root = tmp_path_factory.mktemp("targets")
    crashed = {(b, 1, 131072): {"status": "crashed"} for b in ("foscar-int4", "foscar-int2")}
    unmeasured = [r if (r["backend"], r["batch"], r["kv_len"]) not in crashed
                  else tr.record(r["backend"], 1, 131072, status="crashed") for r in met_everywhere()]
    return {
        "missed": tr.write_store(root / "missed.sqlite", {"grid-1": ("aaaa1111", tr.grid())}),
        "met": tr.write_store(root / "met.sqlite", {"grid-1": ("aaaa1111", tr.grid()),
                                                    "grid-2": ("bbbb2222", met_everywhere())}),
        "unmeasured": tr.write_store(root / "unmeasured.sqlite", {"grid-1": ("aaaa1111", unmeasured)}),
    }


def test_prints_the_scorecard(stores):
    res = invoke(["--db", str(stores["missed"])])
    assert res.exit_code == 0, res.output
    assert "judged on NVIDIA H200" in res.output and "FOSCAR INT4: fraction of bus peak" in res.output
    # INT2 misses both bandwidth goals and its ALU goal
    assert f"{N_TARGETS} targets: 8 met, 3 missed, 0 not measured." in res.output


def test_fail_on_miss_exit_codes(stores):
    assert invoke(["--db", str(stores["missed"]), "--fail-on-miss"]).exit_code == 1
    assert invoke(["--db", str(stores["missed"])]).exit_code == 0
    # the latest run (grid-2) meets every goal; --run picks grid-1, which misses three
    assert invoke(["--db", str(stores["met"]), "--fail-on-miss"]).exit_code == 0
    assert invoke(["--db", str(stores["met"]), "--run", "grid-1", "--fail-on-miss"]).exit_code == 1
    assert invoke(["--db", str(stores["met"]), "--run", "aaaa1111", "--fail-on-miss"]).exit_code == 1
    # not measured is no miss: exit 0, and the table says which
    res = invoke(["--db", str(stores["unmeasured"]), "--fail-on-miss"])
    assert res.exit_code == 0, res.output
    # the two batch-1 rows, and the four geo-means over 15 of the 16 cases
    assert "5 met, 0 missed, 6 not measured" in res.output


def test_json_out_holds_the_rows(stores, tmp_path):
    out = tmp_path / "card.json"
    res = invoke(["--db", str(stores["met"]), "--run", "all", "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["runs"] == ["grid-1", "grid-2"] and str(stores["met"]) in doc["store"]
    rows = doc["rows"]
    assert len(rows) == N_TARGETS and {r["status"] for r in rows} == {"met"}
    first = rows[0]
    assert first["goal_text"] == ">= 93.0%" and first["case"] == "batch 128, KV 32768"
    assert first["runs"] == "grid-2" and first["commits"] == "bbbb2222" and first["gpu"] == tr.GPU
    assert {r["cases"] for r in rows if r["metric"] == "speedup_geomean"} == {16}


def test_bad_run_names_the_value(stores):
    line = one_line(["--db", str(stores["met"]), "--run", "nope"], 2)
    assert "'nope'" in line and "neither a run id nor a git sha" in line


@pytest.mark.parametrize("args, words", [
    (["--gpu", "B200"], ("'B200'", "NVIDIA H200")),
    (["--bundled"], ("--bundled or --db",)),
])
def test_bad_input_is_one_line(stores, args, words):
    line = one_line(["--db", str(stores["met"]), *args], 2)
    assert all(w in line for w in words), line


def test_missing_store_and_json_folder(tmp_path):
    line = one_line(["--db", str(tmp_path / "none.sqlite")], 2)
    assert "does not exist" in line and str(tmp_path / "none.sqlite") in line
    line = one_line(["--bundled", "--json-out", str(tmp_path / "no" / "card.json")], 2)
    assert "--json-out" in line and "does not exist" in line


def test_the_bundled_store(tmp_path):
    before = hashlib.sha256(BUNDLED.read_bytes()).hexdigest()
    out = tmp_path / "bundled.json"
    res = invoke(["--bundled", "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["target"] for r in rows] and len(rows) == N_TARGETS
    assert all(r["status"] in ("met", "missed", "not measured") for r in rows)
    for r in rows:
        assert r["target"].split(":")[0] in res.output
    assert hashlib.sha256(BUNDLED.read_bytes()).hexdigest() == before
