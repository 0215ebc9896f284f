"""Dynamic analysis without a GPU: ncu's CSV, per-launch sums, per-element arithmetic, the
missing/unusable-ncu paths, and the ncu command line, through a stand-in ncu."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from suite.alu import ncu
from suite.alu.ncu import METRICS, derive, kv_elements, parse_csv, parse_number, per_launch
from core.case import Case

DATA = Path(__file__).parent / "data"
E = 2 * 1024 * 8 * 128 * 2  # batch 2, kv 1024, 8 KV heads, d 128, K and V


@pytest.fixture
def case():
    return Case(batch=2, kv_len=1024, bits=4, page_size=128)


@pytest.fixture
def raw_text():
    return (DATA / "ncu_raw_two_kernels.csv").read_text()


def test_parse_number():
    assert parse_number("1,234,567") == 1234567.0
    assert parse_number("2,068.50") == 2068.5
    assert parse_number(" 0 ") == 0.0
    for empty in ("n/a", "", "-", None, "(!)"):
        assert parse_number(empty) is None


def test_unit_scale():
    assert ncu.unit_scale("byte") == 1 and ncu.unit_scale("Mbyte") == 1e6 and ncu.unit_scale("Gbyte") == 1e9
    assert ncu.unit_scale("usecond") == 1e3 and ncu.unit_scale("msecond") == 1e6 and ncu.unit_scale("ns") == 1
    assert ncu.unit_scale("inst") == 1 and ncu.unit_scale("Kinst") == 1e3 and ncu.unit_scale("%") == 1


def test_parse_raw_csv(raw_text):
    rows = parse_csv(raw_text)
    assert [r.id for r in rows] == [0, 1, 2, 3]
    assert rows[0].kernel.startswith("void foscar::foscar_decode_kernel<4, 128, 128, true")  # commas kept
    assert rows[1].kernel.startswith("void merge_states_kernel<128>(const float *")
    assert rows[0].values[METRICS["inst"]] == 1_048_576  # "1,048,576"
    assert rows[0].values[METRICS["dram_read_bytes"]] == pytest.approx(8.39e6)  # Mbyte -> byte
    assert rows[0].values[METRICS["time_ns"]] == pytest.approx(12_500)  # usecond -> ns
    assert rows[1].values[METRICS["op_misc"]] is None  # n/a
    assert rows[0].info["Block Size"] == "(256, 1, 1)"


def test_per_launch_sums_kernels_and_divides(raw_text):
    per = per_launch(parse_csv(raw_text), launches=2)
    assert per["thread_alu"] == 3_100_000 + 45_728
    assert per["inst"] == 1_048_576 + 4_096
    assert per["dram_read_bytes"] == pytest.approx((8.39e6 + 8.41e6 + 0.05e6 * 2) / 2)
    assert per["time_ns"] == pytest.approx((12_500 + 12_700 + 2_100 + 2_300) / 2)
    assert per["op_misc"] == 12_345  # the second kernel's n/a is left out, not taken as 0 or as a guess
    with pytest.raises(ValueError):
        per_launch([], 0)


def test_derive_per_element(raw_text, case):
    assert kv_elements(case) == E
    per = per_launch(parse_csv(raw_text), launches=2)
    fig = derive(per, E, read_bytes=8.0e6)
    assert fig["alu_per_elem"] == pytest.approx((3_100_000 + 45_728) / E) == pytest.approx(0.75)
    assert fig["alu_issue_per_elem"] == pytest.approx(32 * (98_304 + 1_429) / E)
    assert fig["inst_per_elem"] == pytest.approx((33_030_144 + 120_000) / E)
    assert fig["inst_issue_per_elem"] == pytest.approx(32 * (1_048_576 + 4_096) / E)
    mix = fig["pipe_mix"]
    assert mix["tensor"]["per_elem"] == pytest.approx(32 * 16_384 / E)
    assert mix["alu"]["share"] == pytest.approx((98_304 + 1_429) / (1_048_576 + 4_096))
    assert fig["dram_model_ratio"] == pytest.approx(8.45e6 / 8.0e6)
    assert fig["dram_flag"] is True  # 5.6% over the model
    assert fig["time_us"] == pytest.approx(14.8)
    within = derive(per, E, read_bytes=8.3e6)
    assert within["dram_flag"] is False
    none = derive(per, E, read_bytes=None)
    assert none["dram_model_ratio"] is None and none["dram_flag"] is None


def test_missing_counters_stay_empty():
    fig = derive({"inst": None, "thread_alu": None}, E)
    assert fig["alu_per_elem"] is None and fig["inst_issue_per_elem"] is None and fig["pipe_mix"] == {}


def test_parse_details_page():
    text = (
        '==PROF== Connected to process 1\n'
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
        '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n'
        '"0","1","p","h","k1","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics",'
        '"smsp__inst_executed.sum","inst","173,251,584"\n'
        '"0","1","p","h","k1","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics",'
        '"dram__bytes_read.sum","Kbyte","1.50"\n'
    )
    [row] = parse_csv(text)
    assert row.kernel == "k1" and row.values["smsp__inst_executed.sum"] == 173_251_584
    assert row.values["dram__bytes_read.sum"] == pytest.approx(1500)


@pytest.mark.parametrize("needle,status", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", "no_permission"),
    ("==ERROR== Failed to initialize the profiler: LibraryNotLoaded", "profiler_unusable"),
    ("==WARNING== No kernels were profiled.", "no_kernels"),
])
def test_unusable_ncu_gives_status_not_figures(case, needle, status):
    res = ncu.result_from_output("foscar-int4", case, f"==PROF== Connected\n{needle}\n", 1, 2)
    assert res.status == status and res.reason and res.figures == {} and res.per_launch == {}
    stored = res.store_fields()
    assert stored["alu_per_elem"] is None and stored["alu_status"] == status


def test_target_failure_keeps_tail(case):
    res = ncu.result_from_output("x", case, "Traceback ...\nRuntimeError: boom\n", 1, 2)
    assert res.status == "target_failed" and "boom" in res.reason


def test_missing_ncu(monkeypatch, case):
    monkeypatch.setattr(ncu, "find_ncu", lambda: None)
    res = ncu.profile_case("torch-ref", case)
    assert res["status"] == "ncu_missing" and "ncu" in res["reason"]
    assert res["figures"] == {} and res["per_launch"] == {}


def test_command_line():
    cmd = ncu.ncu_command("ncu", ["python", "-m", "t"], kernel_regex="decode", launch_count=4)
    joined = " ".join(cmd)
    assert cmd[0] == "ncu" and cmd[-3:] == ["python", "-m", "t"]
    assert "--clock-control none" in joined and "--target-processes all" in joined
    assert "--nvtx --nvtx-include foscar_alu/" in joined and "--kernel-name regex:decode" in joined
    assert "--launch-count 4" in joined and "--page raw" in joined and "--print-units base" in joined
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert metrics == list(METRICS.values())


def _fake_ncu(tmp_path: Path, body: str) -> str:
    """A stand-in `ncu` that records its arguments and prints `body`."""
    script = tmp_path / "ncu"
    (tmp_path / "out.txt").write_text(body)
    script.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/args.txt"\ncat "{tmp_path}/out.txt"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_profile_case_through_stand_in_ncu(tmp_path, raw_text, case):
    fake = _fake_ncu(tmp_path, raw_text)
    res = ncu.profile_case("foscar-int4", case, iters=2, ncu=fake, log_path=tmp_path / "log.txt")
    assert res["status"] == "ok", res["reason"]
    args = (tmp_path / "args.txt").read_text()
    assert "-m suite.alu.target --backend foscar-int4" in args and "--iters 2" in args
    assert json.loads(args.split("--case-json ")[1].split(" --warmup")[0])["batch"] == 2
    assert res["case_key"] == case.key
    assert [k["launches"] for k in res["kernels"]] == [2, 2]
    fig = res["figures"]
    assert fig["alu_per_elem"] == pytest.approx(0.75)
    assert fig["model_read_bytes"] is not None  # from core.bytes_model for the INT4 format
    assert (tmp_path / "log.txt").read_text().startswith(fake)


def test_profile_case_unsupported_and_permission(tmp_path, case):
    res = ncu.profile_case("torch-ref", case, ncu=_fake_ncu(tmp_path, "UNSUPPORTED: needs a GPU\n"))
    assert res["status"] == "unsupported" and res["reason"] == "needs a GPU"
    res = ncu.profile_case("torch-ref", case, ncu=_fake_ncu(tmp_path, "==ERROR== ERR_NVGPUCTRPERM\n"))
    assert res["status"] == "no_permission" and res["figures"] == {}


def test_real_h200_capture_of_a_two_kernel_backend():
    """ncu's own output for 2 decode steps of foscar-int4 at batch 8, KV 8192 on our H200, as
    `foscar-bench alu --ncu-log` kept it from the v1 kernels, which merged split-KV partials
    in a second kernel (today's decode kernel merges them itself): two kernels a step."""
    text = (DATA / "ncu_foscar_int4_h200.txt").read_text()
    rows = parse_csv(text)
    assert len(rows) == 4 and len({r.kernel for r in rows}) == 2
    assert sum("foscar_decode_kernel" in r.kernel for r in rows) == 2
    case = Case(batch=8, kv_len=8192, bits=4, page_size=128)
    fig = derive(per_launch(rows, 2), kv_elements(case), read_bytes=71_370_784)
    assert fig["alu_per_elem"] == pytest.approx(1.4285, abs=1e-4)
    assert fig["alu_issue_per_elem"] == pytest.approx(1.4360, abs=1e-4)  # full warps: close to it
    assert fig["dram_model_ratio"] == pytest.approx(1.0048, abs=1e-4) and fig["dram_flag"] is False
    assert fig["pipe_mix"]["tensor"]["per_elem"] == pytest.approx(0.125)  # one HMMA per 8 elements


def test_own_case_follows_a_backends_width():
    from baselines.base import get_backend

    case = Case(batch=2, kv_len=1024, bits=4)
    assert ncu.own_case(get_backend("foscar-int2"), case).bits == 2
    assert ncu.own_case(get_backend("foscar-int4"), case).bits == 4
    assert ncu.own_case(get_backend("torch-ref"), case).bits == 4
