"""scripts/calls/: the next device session's calls. What can be checked without a GPU: the scripts
parse, any.sh sends an H200 to item0.sh and another card to h100.sh, a call without prepare.sh's
.snap/ says so, and the small-launch row's patch still applies to the tree (prepare.sh commits it
on HEAD as branch h200-small)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

CALLS = sorted((ROOT / "scripts" / "calls").glob("*.sh"))


@pytest.mark.parametrize("path", CALLS, ids=[p.name for p in CALLS])
def test_each_call_parses(path):
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _tree_with_fake_card(tmp_path: Path, card: str) -> tuple[Path, dict]:
    """A copy of any.sh beside stub item0.sh / h100.sh, and an nvidia-smi that names `card`."""
    calls = tmp_path / "scripts" / "calls"
    calls.mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "calls" / "any.sh", calls / "any.sh")
    for name in ("item0", "h100"):
        (calls / f"{name}.sh").write_text(f"echo ran {name}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{card}'\n")
    smi.chmod(0o755)
    return tmp_path, {"PATH": f"{bin_dir}:/usr/bin:/bin"}


@pytest.mark.parametrize("card, ran", [("NVIDIA H200", "item0"), ("NVIDIA H100 80GB HBM3", "h100")])
def test_any_sends_each_card_to_its_call(tmp_path, card, ran):
    cwd, env = _tree_with_fake_card(tmp_path, card)
    r = subprocess.run(["bash", "scripts/calls/any.sh"], cwd=cwd, env=env, capture_output=True, text=True)
    assert r.stdout.strip() == f"ran {ran}", r.stdout + r.stderr


@pytest.mark.parametrize("name", ["item0.sh", "h100.sh"])
def test_a_call_without_the_snapshot_says_what_to_run(tmp_path, name):
    shutil.copytree(ROOT / "scripts" / "calls", tmp_path / "scripts" / "calls")
    r = subprocess.run(["bash", f"scripts/calls/{name}"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)},
                       capture_output=True, text=True)
    assert r.returncode == 2 and "run scripts/calls/prepare.sh" in r.stdout, r.stdout + r.stderr


def test_the_small_launch_row_still_applies():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "apply", "--check", "docs/data/h200_small_launch_row.patch"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, f"docs/data/h200_small_launch_row.patch no longer applies to the tree: {r.stderr}"
