"""`foscar-bench alu` end to end without a GPU: static from a listing, dynamic through a
stand-in ncu, figures into the results store and a JSON file."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from suite.cli import app

DATA = Path(__file__).parent / "data"
runner = CliRunner()


def test_needs_a_mode():
    res = runner.invoke(app, ["alu"])
    assert res.exit_code != 0


def test_static_from_cubin(monkeypatch, tmp_path):
    from suite.alu import sass

    monkeypatch.setattr(sass, "disassemble", lambda path, arch=None: (DATA / "sass_probe_sm90a.txt").read_text())
    cubin = tmp_path / "probe.cubin"
    cubin.write_bytes(b"")
    out = tmp_path / "static.json"
    res = runner.invoke(app, ["alu", "--static", "--cubin", str(cubin), "--kernel", "kv_loop", "--elems", "8",
                              "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    [row] = json.loads(out.read_text())["static"]
    assert row["name"] == "probe_kv_loop" and row["alu_per_elem"] == pytest.approx(1.0)
    assert row["loop"] == [0x1B0, 0x2A0]


def test_static_explicit_loop(monkeypatch, tmp_path):
    from suite.alu import sass

    monkeypatch.setattr(sass, "disassemble", lambda path, arch=None: (DATA / "sass_demo_decode_sm90a.txt").read_text())
    cubin = tmp_path / "demo.cubin"
    cubin.write_bytes(b"")
    out = tmp_path / "s.json"
    res = runner.invoke(app, ["alu", "--static", "--cubin", str(cubin), "--kernel", "demo_decode", "--elems", "8",
                              "--loop", "0x270:0x2e0", "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["static"][0]["by_class"]["tensor"] == 1
    bad = runner.invoke(app, ["alu", "--static", "--cubin", str(cubin), "--loop", "nonsense"])
    assert bad.exit_code != 0


def test_static_error_is_one_line(tmp_path):
    res = runner.invoke(app, ["alu", "--static", "--cubin", str(tmp_path / "missing.cubin")])
    assert res.exit_code == 1 and "does not exist" in res.output


def test_dynamic_into_store_and_json(monkeypatch, tmp_path):
    from baselines.base import get_backend
    from core.case import Case
    from core.store import ResultStore

    body = (DATA / "ncu_raw_two_kernels.csv").read_text()
    script = tmp_path / "ncu"
    (tmp_path / "out.txt").write_text(body)
    script.write_text(f'#!/bin/sh\ncat "{tmp_path}/out.txt"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("NCU", str(script))

    db = tmp_path / "r.sqlite"
    case = get_backend("torch-ref").case_for(Case(batch=2, kv_len=1024))  # the case torch-ref really runs
    with ResultStore(db) as store:
        run_id = store.start_run(argv=["test"], config={}, env={})
        store.add_record(run_id, {"case_key": case.key, "backend": "torch-ref", "status": "passed"})
    out = tmp_path / "dyn.json"
    res = runner.invoke(app, ["alu", "-b", "torch-ref", "--batch", "2", "--kv-len", "1024", "--run", run_id,
                              "--db", str(db), "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    [row] = json.loads(out.read_text())["dynamic"]
    assert row["status"] == "ok" and row["case_key"] == case.key
    with ResultStore(db) as store:
        rec = store.records(run_id).iloc[0]
    assert rec["alu_per_elem"] == pytest.approx(0.75)
    assert rec["dram_bytes_read"] == pytest.approx(8.45e6)
    assert rec["dram_model_ratio"] is not None
    assert "alu" in json.loads(rec["pipe_mix_json"])
    assert rec["alu_status"] == "ok"  # a record column now (core.record.AluFields)


def test_dynamic_that_profiles_nothing_exits_3(monkeypatch, tmp_path):
    # /tmp/rev_cli: without ncu every row was ncu_missing and alu said rc 0
    from suite.alu import ncu

    monkeypatch.setattr(ncu, "find_ncu", lambda: None)
    out = tmp_path / "dyn.json"
    res = runner.invoke(app, ["alu", "-b", "torch-ref", "--batch", "2", "--kv-len", "1024", "--json-out", str(out)])
    assert res.exit_code == 3, res.output
    assert "no backend could be profiled (ncu_missing" in " ".join(res.output.split())
    [row] = json.loads(out.read_text())["dynamic"]  # what it found is still written
    assert row["status"] == "ncu_missing"
