"""compare and the noise rule: a planted 10% slowdown gates CI, a change inside the noise does not."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from reports import noise
from reports.compare import compare
from reports.noise import Sample, classify, parse_fraction
from reports.source import open_store
from reports_fixture import PLANTED_NOISE, PLANTED_SLOW
from suite.cli import app


def _row(cmp, planted):
    backend, batch, kv_len, _ = planted
    ch = cmp.changes
    return ch[(ch["backend"] == backend) & (ch["batch"] == batch) & (ch["kv_len"] == kv_len)].iloc[0]


def test_planted_slowdown_is_caught_and_noise_is_ignored(fixture_store):
    db, base, head = fixture_store
    cmp = compare(open_store(db), base, head, min_change=0.02, fail_threshold=0.05)
    slow = _row(cmp, PLANTED_SLOW)
    assert slow["verdict"] == noise.REGRESSION and slow["gate"]
    assert slow["change"] == pytest.approx(0.10, abs=0.01)
    quiet = _row(cmp, PLANTED_NOISE)
    assert quiet["verdict"] == noise.SAME and not quiet["gate"]
    assert len(cmp.failures) == 1
    assert (cmp.changes["verdict"] == noise.REGRESSION).sum() == 1


def test_compare_cli_exit_codes(fixture_store):
    db, base, head = fixture_store
    runner = CliRunner()
    failed = runner.invoke(app, ["compare", base, head, "--db", str(db), "--fail-on-regression", "5%"])
    assert failed.exit_code == 1, failed.output
    assert "foscar-int2" in failed.output and "fails gate" in failed.output
    lenient = runner.invoke(app, ["compare", "a1b2c3d4", "f00dfeed", "--db", str(db), "--fail-on-regression", "15%"])
    assert lenient.exit_code == 0, lenient.output
    no_gate = runner.invoke(app, ["compare", base, head, "--db", str(db)])
    assert no_gate.exit_code == 0
    same = runner.invoke(app, ["compare", head, head, "--db", str(db), "--fail-on-regression", "1%"])
    assert same.exit_code == 0 and "0 regression" in same.output
    unknown = runner.invoke(app, ["compare", "nope", head, "--db", str(db)])
    assert unknown.exit_code == 2 and "neither a run id" in unknown.output


def test_rule_needs_threshold_and_separated_bands():
    base = Sample(100.0, 99.0, 101.0)
    assert classify(base, Sample(110.0, 109.0, 111.0), 0.05) == noise.REGRESSION
    assert classify(base, Sample(90.0, 89.0, 91.0), 0.05) == noise.IMPROVEMENT
    # beyond the threshold, but HEAD's band reaches into BASE's: noise, not a change
    assert classify(base, Sample(106.0, 100.5, 112.0), 0.05) == noise.SAME
    # bands apart, but below the threshold
    assert classify(base, Sample(103.0, 102.0, 104.0), 0.05) == noise.SAME
    # a bigger-is-better metric swaps the verdicts
    assert classify(base, Sample(110.0, 109.0, 111.0), 0.05, smaller_is_better=False) == noise.IMPROVEMENT
    # no band: the median alone is the band
    assert classify(Sample(100.0), Sample(110.0), 0.05) == noise.REGRESSION


def test_status_loss_fails_the_gate(fixture_store, tmp_path):
    from reports_fixture import _record, BACKENDS  # noqa: F401
    import random

    from core.store import ResultStore

    db = tmp_path / "s.sqlite"
    with ResultStore(db) as store:
        a = store.start_run(argv=[], config={}, env={}, run_id="A")
        b = store.start_run(argv=[], config={}, env={}, run_id="B")
        rng = random.Random(0)
        store.add_record(a, _record("foscar-int4", 8, 4096, 1.0, rng))
        crashed = {**_record("foscar-int4", 8, 4096, 1.0, rng), "status": "crashed", "reason": "illegal address"}
        store.add_record(b, crashed)
    cmp = compare(open_store(db), "A", "B", fail_threshold=0.05)
    assert cmp.changes["verdict"].tolist() == ["now crashed"]
    assert len(cmp.failures) == 1


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), ("5", 0.05), ("12.5%", 0.125), (None, None)])
def test_parse_fraction(text, value):
    assert parse_fraction(text) == (pytest.approx(value) if value is not None else None)


def test_parse_fraction_rejects_words():
    with pytest.raises(ValueError, match="not a number"):
        parse_fraction("five")
