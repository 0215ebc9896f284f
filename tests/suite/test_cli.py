"""The command line with stand-in backends (typer's CliRunner), on the CPU."""
import json

import pandas as pd
import pytest
import harness_doubles
from typer.testing import CliRunner

from suite.cli import COMMANDS, app

runner = CliRunner()
REQUIRED = ("run_id", "backend", "batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim", "bits",
            "k_mode", "v_mode", "group_size", "gpu_name", "status", "reason", "median_us", "p10_us",
            "p90_us", "bytes", "eff_bandwidth_tbps", "frac_peak_bus", "frac_peak_datasheet", "rel_error")
SMALL = ["--batch", "2", "--kv-len", "128", "--num-q-heads", "4", "--num-kv-heads", "2", "--head-dim", "64"]


def test_help_lists_commands():
    import typer

    # The registered commands themselves, not words in the help text (the app's description
    # also says "build", "sweep" and "report").
    names = [c.name for c in typer.main.get_command(app).commands.values()]
    assert names == list(COMMANDS)
    assert set(COMMANDS) >= {"build", "sweep", "results", "report", "alu", "dashboard", "compare", "env"}
    # and --help shows each as an entry of its command list, in that order
    out = runner.invoke(app, ["--help"]).output
    # (a row's first column; a wrapped description's next lines leave it blank)
    firsts = [line[2:].split(" ")[0] for line in out.splitlines() if line.startswith("│ ") and line[2] != " "]
    assert [w for w in firsts if w in COMMANDS] == list(COMMANDS)


def test_command_list_entries_are_one_paragraph_each():
    # A docstring's first paragraph wraps in its source; the command list would keep those
    # breaks (ragged rows), so each entry is the paragraph on one line, rewrapped by --help.
    from suite.cli import _one_line

    for info in app.registered_commands:
        doc = info.callback.__doc__
        assert info.short_help == _one_line(doc) and "\n" not in info.short_help, info.name
    assert _one_line("Run a sweep. A case\n    that fails.\n\n    More.") == "Run a sweep. A case that fails."


def test_dry_run_lists_cases_without_a_store(tmp_path):
    db = tmp_path / "none.sqlite"
    res = runner.invoke(app, ["sweep", "--preset", "paper", "--dry-run", "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "flashinfer-bf16-tc" in res.output and "trtllm-xqa-fp8" in res.output and "32768" in res.output
    assert not db.exists()


def test_sweep_without_gpu_says_so_in_one_line(tmp_path, monkeypatch):
    import suite.envinfo

    monkeypatch.setattr(suite.envinfo, "visible_gpu_count", lambda: 0)
    db = tmp_path / "x.sqlite"
    res = runner.invoke(app, ["sweep", "--preset", "paper", "--db", str(db)])
    assert res.exit_code == 1
    lines = [l for l in res.output.splitlines() if l.strip()]
    assert len(lines) == 1 and "--dry-run" in lines[0] and "report --bundled" in lines[0]
    assert not db.exists()


def test_list_backends(monkeypatch):
    import suite.envinfo

    monkeypatch.setattr(suite.envinfo, "visible_gpu_count", lambda: 0)
    res = runner.invoke(app, ["sweep", "--list-backends"])
    assert res.exit_code == 0 and "bitdecoding-int4" in res.output and "foscar-int2" in res.output
    here = {line.split()[0]: line.split()[4] for line in res.output.splitlines()
            if line.split() and line.split()[0] in ("torch-ref", "foscar-int4", "trtllm-xqa-fp8", "trtllm-nvfp4")}
    # on a machine without a GPU only torch-ref can run
    assert here == {"torch-ref": "yes", "foscar-int4": "no", "trtllm-xqa-fp8": "no", "trtllm-nvfp4": "no"}
    assert "foscar-int4: needs a CUDA GPU; none is visible here." in res.output
    assert "test-" not in res.output


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    db = tmp_path_factory.mktemp("cli") / "out.sqlite"
    with harness_doubles.registered():
        res = runner.invoke(app, ["sweep", "--cpu", "--no-progress", "--db", str(db),
                                  "--backends", "test-stub,test-wrong,test-unsupported", *SMALL])
    assert res.exit_code == 0, res.output
    return db, res.output


def test_sweep_with_stand_ins(swept):
    db, output = swept
    assert "test-stub" in output and "passed" in output and "incorrect" in output
    res = runner.invoke(app, ["results", "--db", str(db), "--json"])
    rows = [json.loads(l) for l in res.output.splitlines() if l.strip()]
    assert len(rows) == 3
    for r in rows:
        assert set(REQUIRED) <= set(r)
    by = {r["backend"]: r for r in rows}
    assert by["test-stub"]["status"] == "passed" and by["test-stub"]["median_us"] > 0
    assert by["test-stub"]["rel_error"] < 1e-2 and by["test-stub"]["gpu_name"] == "cpu"
    assert by["test-wrong"]["status"] == "incorrect" and by["test-wrong"]["median_us"] is None
    assert by["test-unsupported"]["reason"]


def test_resume_adds_nothing_when_done(swept, doubles):
    db, _ = swept
    run = json.loads(runner.invoke(app, ["results", "--db", str(db), "--json"]).output.splitlines()[0])["run_id"]
    res = runner.invoke(app, ["sweep", "--cpu", "--resume", run, "--db", str(db), "--no-progress"])
    assert res.exit_code == 0, res.output
    rows = runner.invoke(app, ["results", "--db", str(db), "--run", run, "--json"]).output.splitlines()
    assert len([l for l in rows if l.strip()]) == 3
    bad = runner.invoke(app, ["sweep", "--cpu", "--resume", "no-such-run", "--db", str(db)])
    assert bad.exit_code == 2 and "not in" in bad.output


def test_results_exports(swept, tmp_path):
    db, _ = swept
    csv = tmp_path / "r.csv"
    assert runner.invoke(app, ["results", "--db", str(db), "--csv", str(csv)]).exit_code == 0
    df = pd.read_csv(csv)
    assert len(df) == 3 and set(REQUIRED) <= set(df.columns)
    pq = tmp_path / "r.parquet"
    res = runner.invoke(app, ["results", "--db", str(db), "--parquet", str(pq)])
    if res.exit_code == 0:
        assert len(pd.read_parquet(pq)) == 3
    table = runner.invoke(app, ["results", "--db", str(db)])
    assert "median us" in table.output and "test-stub" in table.output
    runs = runner.invoke(app, ["results", "--db", str(db), "--runs"])
    assert runs.exit_code == 0 and "n_records" in runs.output


def test_results_missing_db(tmp_path):
    res = runner.invoke(app, ["results", "--db", str(tmp_path / "missing.sqlite")])
    assert res.exit_code == 2


def test_env_json_is_valid_without_gpu(monkeypatch):
    import suite.envinfo

    monkeypatch.setattr(suite.envinfo, "_nvml", lambda: None)
    monkeypatch.setattr(suite.envinfo, "_torch_device_count", lambda: 0)
    res = runner.invoke(app, ["env", "--json"])
    assert res.exit_code == 0
    env = json.loads(res.output)
    assert env["gpus"] == [] and "no CUDA GPU" in env["no_gpu"]
    assert "torch" in env["libraries"] and "flashinfer" in env["libraries"]
    text = runner.invoke(app, ["env"]).output
    assert "No GPU" in text


def test_build_table_labels_tell_paired_kernels_apart():
    from suite.commands.build import _label

    one = _label("void foscar::foscar_decode_kernel<4, 128, true, false, false, 1>(foscar::DecodeParams)")
    two = _label("void foscar::foscar_decode_kernel<4, 128, true, false, false, 2>(foscar::DecodeParams)")
    assert one == "decode int4 g128 K channel V token" and two == one + ", 2 KV heads per item"


def test_every_item_crashed_exits_3_some_crashed_exits_0(tmp_path, doubles):
    # A failing case is recorded and the sweep goes on (exit 0); a sweep that measured nothing
    # says so with exit 3 (/tmp/rev_cli: every worker failed to start, rc was 0).
    db = tmp_path / "x.sqlite"
    res = runner.invoke(app, ["sweep", "--cpu", "--no-progress", "--db", str(db), "-b", "test-raise", *SMALL])
    assert res.exit_code == 3, res.output
    assert "none of the 1 item(s) this sweep ran was measured (each ended crashed)" in res.output
    assert "--resume" in res.output
    mixed = runner.invoke(app, ["sweep", "--cpu", "--no-progress", "--db", str(db), "-b", "test-stub,test-raise",
                                *SMALL])
    assert mixed.exit_code == 0, mixed.output
    assert "passed 1" in mixed.output and "crashed 1" in mixed.output


def test_a_sweep_that_pairs_nothing_leaves_no_run(tmp_path):
    from core.store import ResultStore

    db = tmp_path / "x.sqlite"
    with ResultStore(db) as store:
        store.start_run(argv=[], config={}, env={}, run_id="earlier")
    res = runner.invoke(app, ["sweep", "--cpu", "--db", str(db), "-b", "foscar-int2", "--bits", "4", *SMALL])
    assert res.exit_code == 2 and "foscar-int2 (it runs 2-bit cases only" in res.output
    with ResultStore(db, readonly=True) as store:
        assert store.latest_run() == "earlier" and len(store.runs()) == 1


def test_an_empty_shard_records_no_run(tmp_path, doubles):
    db = tmp_path / "x.sqlite"
    res = runner.invoke(app, ["sweep", "--cpu", "--db", str(db), "-b", "test-stub", "--shard", "5/6", *SMALL])
    assert res.exit_code == 0 and "shard 5/6 of this sweep holds no item" in res.output, res.output
    assert not db.exists()


def test_dry_run_under_run_id_checks_the_run_and_shows_what_is_done(tmp_path, doubles):
    db = tmp_path / "x.sqlite"
    named = ["--cpu", "--no-progress", "--db", str(db), "--run-id", "job7", "-b", "test-stub", *SMALL]
    assert runner.invoke(app, ["sweep", *named]).exit_code == 0
    dry = runner.invoke(app, ["sweep", "--dry-run", *named])
    assert dry.exit_code == 0, dry.output
    [row] = [line for line in dry.output.splitlines() if "test-stub" in line]
    assert row.split()[-1] == "yes"  # as the run itself would skip it
    other = runner.invoke(app, ["sweep", "--dry-run", *named, "--batch", "3"])
    assert other.exit_code == 2
    assert "run job7" in other.output and "batch [2] there, [3] here" in other.output
    again = runner.invoke(app, ["sweep", *named, "--batch", "3"])
    assert again.exit_code == 2 and "batch [2] there, [3] here" in again.output


def test_resume_warns_of_every_option_it_ignores(tmp_path, doubles):
    db = tmp_path / "x.sqlite"
    assert runner.invoke(app, ["sweep", "--cpu", "--no-progress", "--db", str(db), "--run-id", "r1",
                               "-b", "test-stub", *SMALL]).exit_code == 0
    res = runner.invoke(app, ["sweep", "--cpu", "--no-progress", "--db", str(db), "--resume", "r1",
                              "--preset", "full", "--shard", "1/4", "--batch", "8"])
    assert res.exit_code == 0, res.output
    warning = " ".join(res.output.split())
    assert "ignoring batch, preset, shard." in warning, warning
