"""A bad input is one line that names the value, says what was expected and what to do,
with a non-zero exit; commands that read the store never change it."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from suite.cli import app

runner = CliRunner()
BUNDLED = Path(__file__).resolve().parents[2] / "reports" / "data" / "bundled.sqlite"


def one_line(args: list[str], code: int | None = None) -> str:
    """Run the CLI; the run must fail with exactly one non-empty line of output."""
    res = runner.invoke(app, args)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)  # no traceback
    assert res.exit_code != 0, res.output
    if code is not None:
        assert res.exit_code == code, res.output
    assert len(lines) == 1, res.output
    return lines[0]


@pytest.fixture
def no_gpu(monkeypatch):
    import suite.envinfo

    monkeypatch.setattr(suite.envinfo, "visible_gpu_count", lambda: 0)


@pytest.fixture
def store(tmp_path) -> Path:
    """A copy of the bundled store (H200 runs) to read."""
    db = tmp_path / "store" / "results.sqlite"
    db.parent.mkdir()
    shutil.copyfile(BUNDLED, db)
    return db


@pytest.mark.parametrize("command", [
    ["results"], ["report"], ["dashboard"], ["compare", "381a8c5", "313b3fc"], ["sweep", "--dry-run", "--resume", "x"],
])
def test_db_naming_a_text_file(tmp_path, command):
    text = tmp_path / "notes.txt"
    text.write_text("these are notes, not a results store\n")
    line = one_line([*command, "--db", str(text), *(["--out", str(tmp_path / "o")] if command[0] in ("report", "dashboard") else [])])
    assert str(text) in line and "not a results store" in line and "--db" in line
    assert text.read_text() == "these are notes, not a results store\n"


def test_sweep_db_naming_a_text_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("notes\n")
    line = one_line(["sweep", "--cpu", "--preset", "quick", "--backends", "torch-ref", "--db", str(text)], 2)
    assert "not a results store" in line and text.read_text() == "notes\n"


@pytest.mark.parametrize("args, words", [
    (["--batch", "abc"], ("--batch", "'abc'", "whole number")),
    (["--kv-len", "-5"], ("kv_len", "-5", "not positive")),
    (["--kv-len", "1k,x"], ("--kv-len", "'x'", "whole number")),
    (["--backends", "nosuch"], ("nosuch", "expected one of")),
    (["--model", "gpt-9"], ("gpt-9", "llama3-8b")),
    (["--q-len", "4"], ("--q-len", "sweep --help")),
    # axis values no backend takes (/tmp/rev_cli): a typo'd mode, odd widths, a group of 0
    (["--k-mode", "tokn"], ("'tokn'", "'token'", "'channel'")),
    (["--v-mode", "chanel"], ("'chanel'", "'channel'")),
    (["--bits", "3,16"], ("bits", "3", "[2, 4, 8, 16]")),
    (["--bits", "16"], ("[16]", "'channel'", "2 or 4", "--k-mode none")),
    (["--group-size", "0"], ("group_size 0", "[32, 64, 128]")),
    (["--group-size", "48"], ("48", "[32, 64, 128, 0]")),
    (["--k-mode", "none"], ("'none'", "v_mode 'token'")),
    # an empty list is not "everything"
    (["--batch", ""], ("--batch", "names no value")),
    (["--model", ""], ("--model", "names nothing")),
    (["--backends", ""], ("--backends", "names nothing")),
    (["--backends", " , "], ("--backends", "names nothing")),
    (["--gpus", "0,0"], ("--gpus 0,0", "index 0", "more than once")),
    # backends that pair with no case
    (["-b", "foscar-int2", "--bits", "4"], ("foscar-int2", "2-bit", "[4]", "--bits")),
    (["-b", "foscar-int4,bitdecoding-int4", "--bits", "2"], ("foscar-int4 (", "bitdecoding-int4 (", "[2]")),
])
def test_sweep_checks_its_arguments_before_looking_for_a_gpu(no_gpu, tmp_path, args, words):
    db = tmp_path / "x.sqlite"
    line = one_line(["sweep", *args, "--db", str(db)], 2)
    assert "No CUDA GPU" not in line
    for word in words:
        assert word in line, line
    assert not db.exists()


@pytest.mark.parametrize("args", [["--batch", ""], ["-b", "foscar-int2", "--bits", "4"], ["--k-mode", "tokn"],
                                  ["--gpus", "0,0"]])
def test_dry_run_refuses_what_the_sweep_refuses(tmp_path, args):
    line = one_line(["sweep", "--dry-run", *args, "--db", str(tmp_path / "x.sqlite")], 2)
    assert "items" not in line


def test_sweep_refuses_a_gpu_index_given_twice(monkeypatch, tmp_path):
    # Two workers on one GPU would time each other's cases (/tmp/rev_cli): refused before
    # any worker or the store.
    import suite.envinfo
    import suite.sweep

    monkeypatch.setattr(suite.envinfo, "visible_gpu_count", lambda: 2)
    monkeypatch.setattr(suite.sweep, "run_sweep", lambda **kw: pytest.fail("no sweep may start"))
    db = tmp_path / "x.sqlite"
    for gpus, twice in (("0,0", "0"), ("1,0,01", "1")):
        line = one_line(["sweep", "-b", "torch-ref", "--batch", "1", "--kv-len", "1k", "--gpus", gpus,
                         "--db", str(db)], 2)
        assert f"--gpus {gpus}" in line and f"index {twice} is given more than once" in line
    assert not db.exists()


def test_sweep_without_gpu_after_good_arguments(no_gpu, tmp_path):
    line = one_line(["sweep", "--batch", "1", "--db", str(tmp_path / "x.sqlite")], 1)
    assert "No CUDA GPU" in line and "report --bundled" in line


def test_preset_with_a_bad_value_names_file_and_key(tmp_path):
    preset = tmp_path / "mine.toml"
    preset.write_text('[sweep]\nbatch = [1, "eight"]\nkv_len = [1024]\n')
    line = one_line(["sweep", "--preset", str(preset), "--dry-run"], 2)
    assert str(preset) in line and "batch" in line and "'eight'" in line


def test_preset_with_broken_syntax_names_file_and_line(tmp_path):
    preset = tmp_path / "broken.toml"
    preset.write_text('[sweep]\nbatch = [1, 8\nkv_len = [1024]\n')
    line = one_line(["sweep", "--preset", str(preset), "--dry-run"], 2)
    assert str(preset) in line and "not valid TOML" in line and "batch" in line


def test_preset_with_an_unknown_key(tmp_path):
    preset = tmp_path / "typo.toml"
    preset.write_text('[sweep]\nbatchs = [1]\n')
    line = one_line(["sweep", "--preset", str(preset), "--dry-run"], 2)
    assert str(preset) in line and "batchs" in line


def test_alu_static_with_an_unknown_arch():
    line = one_line(["alu", "--static", "--arch", "sm_nosuch"])
    assert "sm_nosuch" in line and ("sm_90a" in line or "nvcc" in line)


def test_alu_names_a_bad_backend_in_one_line():
    line = one_line(["alu", "-b", "nosuch"], 2)
    assert "'nosuch'" in line and "expected one of" in line and "foscar-int4" in line


def test_alu_checks_run_and_store_before_profiling(store, tmp_path, monkeypatch):
    import suite.alu.ncu

    monkeypatch.setattr(suite.alu.ncu, "profile_case", lambda *a, **k: pytest.fail("profiled before the checks"))
    missing = tmp_path / "missing.sqlite"
    line = one_line(["alu", "-b", "torch-ref", "--run", "nope", "--db", str(missing)], 2)
    assert str(missing) in line and "does not exist" in line
    line = one_line(["alu", "-b", "torch-ref", "--run", "nope", "--db", str(store)], 2)
    assert "'nope'" in line and "results --runs" in line
    assert not missing.exists()


@pytest.mark.parametrize("args, words", [
    (["--status", "crash"], ("'crash'", "crashed", "expected some of")),
    (["--status", "passed,timeouts"], ("'timeouts'", "timeout")),
    (["--status", ""], ("--status", "names no status")),
    (["--backend", "nosuch"], ("'nosuch'", "foscar-int4", "trailing *")),
    (["--backend", "zzz*"], ("'zzz*'", "matches no backend")),
])
def test_results_filters_name_what_they_do_not_know(store, args, words):
    line = one_line(["results", "--db", str(store), "--all", *args], 2)
    for word in words:
        assert word in line, line


def test_results_backend_takes_a_prefix(store):
    import json

    res = runner.invoke(app, ["results", "--db", str(store), "--all", "--json", "--backend", "foscar*"])
    assert res.exit_code == 0, res.output
    names = {json.loads(line)["backend"] for line in res.output.splitlines() if line.strip()}
    assert names and all(n.startswith("foscar") for n in names) and len(names) > 1


@pytest.mark.parametrize("option", ["--csv", "--parquet"])
def test_results_export_into_a_missing_folder(store, tmp_path, option):
    target = tmp_path / "no" / "such" / "folder" / "r.out"
    line = one_line(["results", "--db", str(store), "--all", option, str(target)], 2)
    assert str(target) in line and "does not exist" in line and "mkdir" in line
    assert not target.parent.exists()


@pytest.mark.parametrize("command", [["report", "--run", "all"], ["dashboard"]])
def test_out_into_an_unwritable_place(store, tmp_path, command):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    line = one_line([*command, "--db", str(store), "--out", str(blocker / "report")], 2)
    assert str(blocker / "report") in line and "writable" in line


def test_report_takes_several_stores(store, tmp_path):
    from core.store import ResultStore

    other = tmp_path / "other.sqlite"
    with ResultStore(other) as s:
        run = s.start_run(argv=[], config={}, env={}, run_id="extra-run")
        s.add_record(run, {"case_key": "c", "backend": "torch-ref", "status": "unsupported", "batch": 1,
                           "kv_len": 1024, "gpu_name": "NVIDIA H200"})
    res = runner.invoke(app, ["report", "--db", str(store), "--db", str(other), "--run", "all",
                              "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    with ResultStore(store, readonly=True) as s:
        n_runs, n_records = len(s.runs()), len(s.records())
    assert f"Report of {n_runs + 1} run(s), {n_records + 1} record(s)" in res.output


def test_dashboard_and_compare_do_not_suggest_flags_they_lack(tmp_path):
    for command in (["dashboard", "--out", str(tmp_path / "d")], ["compare", "a", "b"]):
        line = one_line([*command, "--db", str(tmp_path / "missing.sqlite")])
        assert "does not exist" in line and "--bundled" not in line


def test_reading_commands_leave_the_store_unchanged(store, tmp_path):
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    runs = ["381a8c5", "313b3fc"]
    for args in (
        ["results", "--db", str(store), "--all", "--json"],
        ["results", "--db", str(store), "--runs"],
        ["results", "--db", str(store), "--all", "--csv", str(tmp_path / "r.csv")],
        ["report", "--db", str(store), "--run", "all", "--out", str(tmp_path / "report")],
        ["dashboard", "--db", str(store), "--out", str(tmp_path / "dash")],
        ["compare", *runs, "--db", str(store)],
        ["sweep", "--dry-run", "--db", str(store)],
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, (args, res.output)
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in store.parent.iterdir()) == ["results.sqlite"]  # no -wal/-shm left


def test_the_bundled_report_leaves_the_shipped_file_alone(tmp_path):
    before = hashlib.sha256(BUNDLED.read_bytes()).hexdigest()
    siblings = sorted(p.name for p in BUNDLED.parent.iterdir())
    res = runner.invoke(app, ["report", "--bundled", "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert hashlib.sha256(BUNDLED.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in BUNDLED.parent.iterdir()) == siblings
