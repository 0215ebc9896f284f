"""The read ceiling's search and summary on the CPU, with a fake timer standing in for the GPU."""
import random

import pytest

from suite import readceiling as rc
from suite.readceiling import Candidate


def _fake(tbps_of: dict, noise: float = 0.002, seed: int = 0, fail: set = frozenset()):
    rng = random.Random(seed)
    calls = []

    def time_one(c: Candidate, final: bool):
        calls.append((c, final))
        if c in fail:
            raise RuntimeError("out of resources")
        tb = tbps_of[c] * (1 + rng.uniform(-noise, noise))
        return 1e9 / (tb * 1e12) * 1e6, 0.004  # 1 GB read: median us, spread

    return time_one, calls


def test_search_screens_all_then_times_the_best_in_rounds():
    cands = rc.candidates(132)
    assert len(set(cands)) == len(cands) and any(c.kind == "torch-sum" for c in cands)
    truth = {c: 3.5 + 0.02 * i for i, c in enumerate(cands)}
    best = cands[-2]
    truth[best] = 4.62
    broken = {cands[3]}
    time_one, calls = _fake(truth, fail=broken)
    results = rc.search(cands, lambda c: 10**9, time_one, finalists=4, rounds=3)
    assert results[0].candidate == best
    assert [len(r.rounds) for r in results[:4]] == [3, 3, 3, 3]
    assert all(len(r.rounds) == 1 for r in results[4:])
    assert cands[3] not in {r.candidate for r in results}  # a config that fails is dropped
    finals = [c for c, final in calls if final]
    assert len(finals) == 12 and finals[:4] == finals[4:8]  # interleaved rounds


def test_summary_reports_the_best_with_its_spread():
    c1, c2 = Candidate("persistent", (("programs", 264),)), Candidate("torch-sum")
    r1 = rc.Result(c1, 10**9, [(1e9 / 4.60e12 * 1e6, 0.004), (1e9 / 4.62e12 * 1e6, 0.003), (1e9 / 4.61e12 * 1e6, 0.004)])
    r2 = rc.Result(c2, 10**9, [(1e9 / 4.1e12 * 1e6, 0.01)])
    s = rc.summarize([r1, r2])
    assert s["read_ceiling_tbps"] == pytest.approx(4.61, rel=1e-6)
    assert s["spread"] == pytest.approx(0.02 / 4.61, rel=1e-3)  # the range over rounds is wider than 0.4%
    assert s["rounds"] == 3 and "persistent(programs=264)" in s["method"]
    assert [c["name"] for c in s["candidates"]] == [c1.name, c2.name]
    lines = rc.table(s)
    assert lines[0].startswith("read ceiling 4.610 TB/s") and len(lines) == 3
    assert rc.summarize([])["read_ceiling_tbps"] is None


def test_buffer_size_and_quick_search():
    assert rc.buffer_bytes(141 * 10**9) == 8 << 30
    assert rc.buffer_bytes(16 << 30) == 1 << 30
    quick = rc.candidates(132, quick=True)
    assert 5 <= len(quick) <= 10
    for c in rc.candidates(132):
        if c.kind != "torch-sum":
            assert c.get("tile") // (32 * c.get("warps")) <= rc.MAX_INT32_PER_LANE


def test_ceiling_command_says_no_gpu_in_one_line(monkeypatch):
    from typer.testing import CliRunner

    import suite.envinfo
    from suite.cli import app

    monkeypatch.setattr(suite.envinfo, "visible_gpu_count", lambda: 0)
    res = CliRunner().invoke(app, ["ceiling"])
    assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1


def test_a_ceiling_measured_before_is_reused_on_the_same_gpu_model_only():
    from suite.sweep import Sweep, SweepOptions

    ceiling = {"read_ceiling_tbps": 4.6, "spread": 0.004, "gpu_name": "NVIDIA H200"}
    sweep = Sweep(store=None, run_id="r", items=[], options=SweepOptions(devices=["0", "1"], ceiling=ceiling))
    assert sweep.known_ceilings == {"0": ceiling, "1": ceiling}
    assert Sweep(store=None, run_id="r", items=[], options=SweepOptions(devices=["0"])).known_ceilings == {}
