"""scripts/limit.sh: the device scripts' stages run under `limit`, which is `timeout` except that
a stage cut off or failing says so in its output (kept by the stage's tail in the log) and the
script's end counts those, instead of logging a cut-off stage like a finished one."""
from __future__ import annotations

import subprocess

import pytest

from conftest import ROOT

DEVICE_SCRIPTS = ("h200_record", "h200_shapes", "h200_lab", "h200_e2e")


def bash(line: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"set -uo pipefail; source scripts/limit.sh; {line}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "LOG": str(tmp_path / "log")})


def test_a_cut_off_stage_says_so_in_the_log(tmp_path):
    # As h200_record.sh's stages: the command's output through `tail` into the log.
    r = bash('limit 1 bash -c "echo started; sleep 20" 2>&1 | tail -3 | tee -a "$LOG"; echo "rc=$?"', tmp_path)
    log = (tmp_path / "log").read_text()
    assert "started" in log and "== TIMED OUT after 1 s (rc 124): bash -c" in log, log
    assert "rc=124" in r.stdout
    bash('limit 10 false 2>&1 | tail -1 >> "$LOG"; limit 10 true 2>&1 | tail -1 >> "$LOG"', tmp_path)
    assert "== FAILED (rc 1): false" in (tmp_path / "log").read_text()
    assert bash('limit_failures "$LOG"', tmp_path).stdout.strip() == "2"


@pytest.mark.parametrize("name", DEVICE_SCRIPTS)
def test_device_scripts_time_their_stages_with_limit(name):
    text = (ROOT / "scripts" / f"{name}.sh").read_text()
    assert 'source "$(dirname "${BASH_SOURCE[0]}")/limit.sh"' in text
    code = [line.split("#")[0] for line in text.splitlines()]
    assert not [line for line in code if line.lstrip().startswith("timeout ")], "a bare timeout: its cut goes unsaid"
    assert "limit_failures" in text
    subprocess.run(["bash", "-n", ROOT / "scripts" / f"{name}.sh"], check=True)


def test_the_lab_script_brings_back_at_most_eight_files(tmp_path):
    # Four timelines, the timed comparison and one profile write ten files; a device call brings
    # back eight, so the timelines travel as one tarball. Fakes stand in for the GPU's tools.
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    fake = {  # writes the file after --json, as kernel_lab.py does; ncu and nvidia-smi print a line
        "python3": 'while [[ $# -gt 0 ]]; do [[ $1 == --json ]] && echo "{}" > "$2"; shift; done; echo ok',
        "nvidia-smi": "echo 'NVIDIA H200, 1980 MHz'",
        "ncu": "echo ncu",
    }
    for name, body in fake.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    out = tmp_path / "out"
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "OUT": str(out), "TIMELINE": "tl", "PROFILE": "p", "VARIANTS": "tl="}
    r = subprocess.run(["bash", "scripts/h200_lab.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    names = sorted(p.name for p in out.iterdir())
    assert len(names) <= 8 and "timelines.tar.gz" in names and "lab.json" in names, names
    listed = subprocess.run(["tar", "tzf", out / "timelines.tar.gz"], capture_output=True, text=True, check=True)
    assert len(listed.stdout.split()) == 4
