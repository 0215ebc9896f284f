"""scripts/h200_record.sh's `targets` stage: the scorecard over the call's own grid and paper runs,
run here on copies of the bundled store standing in for a call's stores."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_the_targets_stage_judges_the_calls_runs(tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    for name in ("grid.sqlite", "paper.sqlite"):
        shutil.copyfile(ROOT / "reports" / "data" / "bundled.sqlite", record / name)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(tmp_path), "STAGES": "targets", "GPU_TAG": "h200",
           "FOSCAR_GIT_SHA": "a65701e", "FOSCAR_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run(["bash", "scripts/h200_record.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert "11 targets:" in (tmp_path / "record.log").read_text(), r.stdout + r.stderr
    card = json.loads((record / "targets.json").read_text())
    assert sorted(card["runs"]) == ["grid-h200-a65701e", "paper-h200-a65701e"]
    assert len(card["rows"]) == 11


def test_a_call_without_the_paper_stage_judges_its_grid_alone(tmp_path):
    # `STAGES="tests grid targets"` writes no paper store: the scorecard must not ask for its run
    # (it did, and failed with exit 2, on the twenty-eighth session's H100 call).
    record = tmp_path / "record"
    record.mkdir()
    grid = record / "grid.sqlite"
    shutil.copyfile(ROOT / "reports" / "data" / "bundled.sqlite", grid)
    with sqlite3.connect(grid) as db:  # the grid's store holds the grid's run only
        db.execute("delete from records where run_id like 'paper-%'")
        db.execute("delete from runs where run_id like 'paper-%'")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(tmp_path), "STAGES": "targets", "GPU_TAG": "h200",
           "FOSCAR_GIT_SHA": "a65701e", "FOSCAR_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run(["bash", "scripts/h200_record.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    log = (record.parent / "record.log").read_text()
    assert "FAILED" not in log and "11 targets:" in log, r.stdout + r.stderr + log
    card = json.loads((record / "targets.json").read_text())
    assert card["runs"] == ["grid-h200-a65701e"]
