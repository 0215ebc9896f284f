"""scripts/kernel_lab.py measures through the harness: its command line, and one variant of
our kernels measured by suite.runner.measure on the CPU (the emulator standing in for the
GPU library), so the lab's "passed", bytes and p10 are the sweep's."""
from __future__ import annotations


import pytest

@pytest.fixture(scope="module")
def lab(script):
    return script("kernel_lab")


def test_command_line(lab):
    assert lab.parse_variant("cp=FOSCAR_BULK=0,FOSCAR_STAGES_INT2=2") == (
        "cp", ("-DFOSCAR_BULK=0", "-DFOSCAR_STAGES_INT2=2"))
    assert lab.parse_variant("v4=") == ("v4", ())
    assert lab.parse_config("4ct") == (4, "channel", "token", "fold")
    assert lab.parse_config("2tcd") == (2, "token", "channel", "dequant")
    with pytest.raises(SystemExit, match="4ct"):
        lab.parse_config("8xx")
    assert lab.parse_heads(None) == [None] and lab.parse_heads("1,2") == [1, 2]
    assert lab.parse_splits(None) == [None] and lab.parse_splits("plan,16,32") == [None, 16, 32]
    with pytest.raises(SystemExit, match="'plan'"):
        lab.parse_splits("plan,x")
    with pytest.raises(SystemExit, match=">= 1"):
        lab.parse_splits("0")
    with pytest.raises(SystemExit, match="1 or 2"):
        lab.parse_heads("4")
    args = lab.argparse.Namespace(batch=2, kv_len=300, q_heads=32, kv_heads=8, group=128, page=128)
    case = lab.make_case(args, "2tc")
    assert (case.bits, case.k_mode, case.v_mode, case.model, case.page_size) == (2, "token", "channel", "llama3-8b", 128)


def test_profile_picks_a_build_or_a_prebuilt_library(lab):
    variants = [("base", ()), ("knob", ("-DX=1",))]
    prebuilt = {"old": "/tmp/old/libfoscar.so"}
    assert lab.profiled(variants, prebuilt, "knob") == ([("knob", ("-DX=1",))], {})
    assert lab.profiled(variants, prebuilt, "old") == ([], {"old": "/tmp/old/libfoscar.so"})
    with pytest.raises(SystemExit, match="'nope' names no --variant and no --prebuilt"):
        lab.profiled(variants, prebuilt, "nope")
    assert lab.build_variants([]) == {}


def test_instances_name_the_planners_choice_and_the_own_instance(lab):
    assert lab.parse_instances("planner") == [True]
    assert lab.parse_instances("planner, own") == [True, False]
    for bad in ("", "alt", "planner,3"):
        with pytest.raises(SystemExit, match="expected a comma list of planner and own"):
            lab.parse_instances(bad)

def test_timeline_builds_its_knob_in_or_takes_a_prebuilt_library(lab):
    variants = [("base", ()), ("one", ("-DFOSCAR_PAIR_HEADS=0",))]
    prebuilt = {"old": "/tmp/old/libfoscar.so"}
    assert lab.timelined(variants, prebuilt, "one") == ([("one", ("-DFOSCAR_PAIR_HEADS=0", lab.TIMELINE_KNOB))], {})
    assert lab.timelined([("tl", (lab.TIMELINE_KNOB,))], {}, "tl") == ([("tl", (lab.TIMELINE_KNOB,))], {})
    assert lab.timelined(variants, prebuilt, "old") == ([], {"old": "/tmp/old/libfoscar.so"})
    with pytest.raises(SystemExit, match="'nope' names no --variant and no --prebuilt"):
        lab.timelined(variants, prebuilt, "nope")


@pytest.mark.parametrize("heads", [None, 2])
def test_a_variant_is_measured_by_the_harness(lab, monkeypatch, heads):
    """A FoscarVariant through suite.runner.measure: the library it names reaches
    foscar.kernels.decode, the check uses the one tolerance, and the record carries the
    harness's timing and byte-model bytes."""
    import torch

    from baselines.foscar import TOLERANCE, FoscarVariant
    from core.case import Case
    from core.gpu import GpuInfo
    from foscar import emu, kernels
    from foscar.build import BuildError
    from suite.runner import WorkerContext, measure

    try:
        emu.find_cxx()
    except BuildError:
        pytest.skip("no host C++ compiler: the emulator cannot stand in for the GPU library")
    seen = []

    def decode_on_the_cpu(q, cache, *, sm_scale=None, out=None, variant="fold", library=None, num_splits=None,
                          kv_heads_per_item=None, second_instance=True):
        seen.append((library, kv_heads_per_item, second_instance))
        return emu.decode(q, cache, sm_scale=sm_scale, out=out, variant=variant, kv_heads_per_item=kv_heads_per_item,
                          second_instance=second_instance)

    monkeypatch.setattr(kernels, "decode", decode_on_the_cpu)
    backend = FoscarVariant("knobbed", 4, library="lib-of-this-build", defines=("-DFOSCAR_BULK=0",),
                            kv_heads_per_item=heads, second_instance=False)
    monkeypatch.setattr(backend, "needs_cuda", False)
    case = Case(batch=1, kv_len=200, num_q_heads=8, num_kv_heads=2, page_size=128)  # a pair at ratio 4
    record, fatal = measure(case, backend, WorkerContext(device=torch.device("cpu"), gpu=GpuInfo.cpu()))
    assert not fatal and record.status == "passed", record.reason
    assert seen and set(seen) == {("lib-of-this-build", heads, False)}
    assert record.check.tolerance == TOLERANCE == backend.tolerance and record.check.rel_error <= TOLERANCE
    assert record.traffic.bytes == backend.traffic(case).total
    assert record.timing.timing_method == "cpu" and record.timing.p10_us <= record.timing.median_us
    row = lab.lab_row("4ct", backend.name, 0, record)
    assert row["variant"] == "knobbed" and row["status"] == "passed" and "traceback" not in row
    lab.print_table([row])


def test_timeline_table(lab):
    # Two CTAs of one item each (stamps in ns, 0 not reached): offsets in us from the earliest
    # entry, per phase the median and max, and the merging CTA's merge (merged - written).
    from foscar.kernels import TIMELINE_ITEMS, TIMELINE_PHASES

    blank = [[0] * len(TIMELINE_PHASES)] * (TIMELINE_ITEMS - 1)
    # entry, item, first_copy, first_s, last_trip, folded, stored, written, counted, merge_fenced,
    # merge_weighted, merged, quarter1, half, quarter3, scaled
    merging = [[1000, 1500, 1200, 3000, 5000, 5200, 5800, 6000, 6600, 7000, 8000, 9000, 3800, 4200, 4600, 5500]] + blank
    other = [[2000, 2500, 2200, 3500, 5500, 6200, 6800, 7000, 7400, 0, 0, 0, 4000, 4400, 4800, 6400]] + blank
    t = lab.timeline_table([merging, other])
    assert t["grid"] == 2 and t["tick_ns"] == 200
    assert t["ctas"] == [[0, 0, 0, 0.0, 0.5, 0.2, 2.0, 4.0, 4.2, 4.8, 5.0, 5.6, 6.0, 7.0, 8.0, 2.8, 3.2, 3.6, 4.5],
                         [1, 0, 1, 1.0, 1.5, 1.2, 2.5, 4.5, 5.2, 5.8, 6.0, 6.4, None, None, None, 3.0, 3.4, 3.8, 5.4]]
    assert t["summary"]["scaled"] == {"n": 2, "median_us": 4.95, "max_us": 5.4}
    assert t["summary"]["merge_weighted"] == {"n": 1, "median_us": 7.0, "max_us": 7.0}
    assert t["summary"]["written"] == {"n": 2, "median_us": 5.5, "max_us": 6.0}
    assert t["summary"]["merged"] == {"n": 1, "median_us": 8.0, "max_us": 8.0}
    assert t["merges"] == {"n": 1, "median_us": 3.0, "max_us": 3.0, "each": [[0, 3.0]]}
    lab.print_timeline({"config": "4ct", "variant": "tl", "num_splits": 2, "chunks_per_split": 1, **t, "cold": t},
                       rows=True)


def test_rotation_copies_hold_the_reuse_distance(lab):
    # The timeline's "rotated" state launches on these copies before the stamped launch, as the
    # harness rotates its inputs: together they must hold the bytes asked (4x L2), each its own
    # storage (a shared tensor would stay in L2) with the original's values.
    import torch

    from foscar.cache import quantize
    from foscar.config import QuantConfig

    config = QuantConfig(bits=2, group_size=128, k_mode="channel", v_mode="token")
    k = torch.randn(1, 300, 2, 128, dtype=torch.bfloat16)
    cache = quantize(k, -k, [300], config)
    each = sum(t.numel() * t.element_size() for t in (cache.k_codes, cache.v_codes, cache.k_params,
                                                       cache.v_params, cache.k_tail, cache.v_tail))
    copies = lab.rotation_copies(cache, 5 * each - 1)
    assert len(copies) == 5
    for c in copies:
        for name in ("k_codes", "v_codes", "k_params", "v_params", "k_tail", "v_tail"):
            a, b = getattr(cache, name), getattr(c, name)
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), name
        assert c.page_table is cache.page_table
    assert len(lab.rotation_copies(cache, 10 ** 12, most=7)) == 7
    assert len(lab.rotation_copies(cache, 1)) == 1


def test_command_line_refuses_what_it_would_mislabel(lab):
    # A config with a tail ("4ct2ct", a comma missed) was measured as 4ct; a name given twice
    # kept both labels on the last one's library; a split count twice gave two rows of one name.
    for bad in ("4ct2ct", "4ctx", "4ctdd"):
        with pytest.raises(SystemExit, match="expected bits"):
            lab.parse_config(bad)
    assert lab.parse_config("4ctd") == (4, "channel", "token", "dequant")
    with pytest.raises(SystemExit, match="twice: a"):
        lab.unique_names([("a", ()), ("a", ("-DX=1",))], {})
    with pytest.raises(SystemExit, match="twice: old"):
        lab.unique_names([("old", ())], {"old": "/tmp/old/libfoscar.so"})
    lab.unique_names([("a", ()), ("b", ())], {"old": "/tmp/old/libfoscar.so"})
    with pytest.raises(SystemExit, match="twice"):
        lab.parse_splits("16,plan,16")


def test_rounds_take_turns_first(lab):
    # Each round starts one variant later: none is always measured first after the builds.
    assert [lab.turns(list("abc"), r) for r in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert lab.turns([], 3) == []
