"""scripts/limit.sh: the device scripts' stages run under `limit`, which is `timeout` except that
a stage cut off or failing says so in its output (kept by the stage's tail in the log) and the
script's end counts those, instead of logging a cut-off stage like a finished one."""
from __future__ import annotations

import subprocess

import pytest

from conftest import ROOT

DEVICE_SCRIPTS = ("h200_record", "h200_shapes", "h200_lab", "h200_e2e", "h200_rules")


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


def _fake_gpu_tools(bin_, card: str, **more: str) -> None:
    """Stand-ins for the GPU's tools in bin_: python3 writes the file after --json, as kernel_lab.py
    does, and prints a line for every other step; nvidia-smi prints `card`; `more` adds others
    (name=body)."""
    fake = {
        "python3": 'while [[ $# -gt 0 ]]; do [[ $1 == --json ]] && echo "{}" > "$2"; shift; done; echo ok',
        "nvidia-smi": f"echo '{card}'",
        **more,
    }
    bin_.mkdir()
    for name, body in fake.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)


def test_the_lab_script_brings_back_at_most_eight_files(tmp_path):
    # Four timelines, the timed comparison and one profile write ten files; a device call brings
    # back eight, so the timelines travel as one tarball. Fakes stand in for the GPU's tools.
    bin_ = tmp_path / "bin"
    _fake_gpu_tools(bin_, "NVIDIA H200, 1980 MHz", ncu="echo ncu")
    out = tmp_path / "out"
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "OUT": str(out), "TIMELINE": "tl", "PROFILE": "p", "VARIANTS": "tl="}
    r = subprocess.run(["bash", "scripts/h200_lab.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    names = sorted(p.name for p in out.iterdir())
    assert len(names) <= 8 and "timelines.tar.gz" in names and "lab.json" in names, names
    listed = subprocess.run(["tar", "tzf", out / "timelines.tar.gz"], capture_output=True, text=True, check=True)
    assert len(listed.stdout.split()) == 4


def test_the_rules_script_times_both_trees_and_brings_back_five_files(tmp_path):
    # scripts/h200_rules.sh: the lab's shapes in one tarball, then h200_record.sh on this tree and
    # on the tarball of another, each leaving only its tarball and log (a call brings back 8 files).
    _fake_gpu_tools(tmp_path / "bin", "NVIDIA H200, GPU-0")
    row = tmp_path / "row.tar.gz"
    subprocess.run(["bash", "-c", f"git archive --format=tar.gz HEAD -- scripts > {row}"], cwd=ROOT, check=True)
    out = tmp_path / "out"
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "OUT": str(out), "LIB": "lib.so", "FOSCAR_GIT_SHA": "aaaaaaa",
           "ROW_TREE": str(row), "ROW_SHA": "bbbbbbb", "FOSCAR_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run(["bash", "scripts/h200_rules.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["record.log", "record.tar.gz", "row/record.log", "row/record.tar.gz", "rules_lab.tar.gz"], files
    listed = subprocess.run(["tar", "tzf", out / "rules_lab.tar.gz"], capture_output=True, text=True, check=True)
    assert len([n for n in listed.stdout.split() if n.endswith(".json")]) == 5
    assert "stages: grid paper floor targets" in (out / "row" / "record.log").read_text()


def test_the_rules_script_stops_on_another_card(tmp_path):
    _fake_gpu_tools(tmp_path / "bin", "NVIDIA H100 80GB HBM3, GPU-1")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "LIB": "lib.so"}
    r = subprocess.run(["bash", "scripts/h200_rules.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "not a H200: NVIDIA H100 80GB HBM3" in r.stdout, r.stdout + r.stderr


def test_the_rules_script_runs_the_lab_alone_with_no_stages(tmp_path):
    # STAGES=none: the lab's shapes on the named card, no harness on either tree.
    _fake_gpu_tools(tmp_path / "bin", "NVIDIA H100 80GB HBM3, GPU-1")
    out = tmp_path / "out"
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "OUT": str(out), "LIB": "lib.so", "GPU": "H100",
           "STAGES": "none", "LAB": "3 2048 plan,11 own;8 16384 plan,4 own", "CONFIGS": "4ct",
           "ROW_TREE": str(tmp_path / "absent.tar.gz"), "FOSCAR_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run(["bash", "scripts/h200_rules.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["rules_lab.tar.gz"]
    listed = subprocess.run(["tar", "tzf", out / "rules_lab.tar.gz"], capture_output=True, text=True, check=True)
    assert sorted(n for n in listed.stdout.split() if n.endswith(".json")) == [
        "./lab_rules0_b3_kv2048.json", "./lab_rules1_b8_kv16384.json"]
