"""Sweep declaration: case keys, presets, expansion and pairing with backends."""
import pytest

from baselines.base import select_backends
from core.case import Case
from suite.cases import (
    expand, load_preset, make_spec, pair, parse_int_list, parse_str_list, preset_names,
)


def test_case_key_is_stable():
    c = Case(batch=128, kv_len=32768)
    assert c.key == "b128-kv32768-h32x8-d128-int4-g128-kc-vt-p64-s0"
    assert Case(batch=1, kv_len=1024, bits=16, k_mode="none", v_mode="none", group_size=0).key == (
        "b1-kv1024-h32x8-d128-b16-p64-s0"
    )
    assert Case.from_dict(c.as_dict()) == c
    assert c.shape_key == "b128-kv32768-h32x8-d128"


def test_case_validation():
    with pytest.raises(ValueError, match="batch"):
        Case(batch=0, kv_len=10)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        Case(batch=1, kv_len=10, num_q_heads=30, num_kv_heads=8)


def test_presets_exist_and_load():
    assert {"paper", "quick", "full"} <= set(preset_names())
    paper = load_preset("paper")
    assert paper["batch"] == [128] and paper["kv_len"] == [32768] and paper["models"] == ["llama3-8b"]
    with pytest.raises(ValueError, match="not found"):
        load_preset("nope")


def test_paper_expands_to_every_backend():
    cases = expand(make_spec("paper"))
    assert [(c.batch, c.kv_len, c.bits) for c in cases] == [(128, 32768, 4), (128, 32768, 2)]
    items = pair(cases, select_backends(None))
    names = [b.name for _, b in items]
    # every backend appears; full-precision ones once, int ones per matching width
    assert names.count("flashinfer-bf16-tc") == 1
    assert names.count("trtllm-xqa-fp8") == 1
    assert names.count("torch-ref") == 2
    assert names.count("foscar-int4") == names.count("foscar-int2") == 1
    assert set(names) == {b.name for b in select_backends(None)}
    fi = next(c for c, b in items if b.name == "flashinfer-bf16-tc")
    assert (fi.bits, fi.k_mode, fi.group_size, fi.page_size) == (16, "none", 0, 64)
    ours = next(c for c, b in items if b.name == "foscar-int4")
    assert ours.page_size == 128  # pages hold whole groups of 128


def test_full_and_quick_presets():
    full = expand(make_spec("full"))
    shapes = {(c.batch, c.kv_len) for c in full}
    assert {b for b, _ in shapes} == {1, 8, 32, 128}
    assert min(k for _, k in shapes) == 1024 and max(k for _, k in shapes) == 131072
    assert len(shapes) == 4 * 8
    quick = expand(make_spec("quick"))
    assert 1 <= len(quick) <= 16 and max(c.kv_len for c in quick) <= 4096


def test_cli_axes_override_preset():
    spec = make_spec("paper", batch=[1, 8], kv_len=[1024], bits=[4], models=["llama3-70b"])
    cases = expand(spec)
    assert [(c.batch, c.kv_len, c.num_q_heads, c.num_kv_heads) for c in cases] == [
        (1, 1024, 64, 8), (8, 1024, 64, 8)]


def test_explicit_heads():
    cases = expand(make_spec(None, batch=[2], kv_len=[512], num_q_heads=16, num_kv_heads=2, head_dim=64))
    assert {(c.model, c.num_q_heads, c.num_kv_heads, c.head_dim) for c in cases} == {("custom", 16, 2, 64)}


def test_unknown_model():
    with pytest.raises(ValueError, match="llama3-8b"):
        expand(make_spec(None, models=["gpt-9"]))


def test_parse_lists():
    assert parse_int_list("1k,32K,131072") == [1024, 32768, 131072]
    assert parse_int_list(None) is None
    assert parse_str_list("a, b,,c") == ["a", "b", "c"]


def test_pair_groups_by_shape_and_dedupes():
    backends = select_backends(["flashinfer-bf16", "foscar-int4"])
    cases = expand(make_spec(None, batch=[1, 2], kv_len=[1024], bits=[4, 2], group_size=[64, 128]))
    items = pair(cases, backends)
    # bf16 once per shape; foscar-int4 for each int4 group size
    assert sum(b.name == "flashinfer-bf16" for _, b in items) == 2
    assert sum(b.name == "foscar-int4" for _, b in items) == 4
    shapes = [c.shape_key for c, _ in items]
    assert shapes == sorted(shapes)


def test_every_case_field_is_a_sweep_axis_a_preset_key_and_a_column():
    from dataclasses import fields

    from core.case import SHAPE_FIELDS, axes
    from core.record import COLUMNS
    from suite.cases import preset_keys

    for f in fields(Case):
        assert f.name in COLUMNS
        if f.name not in SHAPE_FIELDS:
            assert f.name in axes() and f.name in preset_keys()
    spec = make_spec(None, batch=[1], kv_len=[64], seed=[0, 1], page_size=[64, 128])
    assert {(c.seed, c.page_size) for c in expand(spec)} >= {(0, 64), (1, 128)}


@pytest.mark.parametrize("overrides, words", [
    (dict(k_mode=["tokn"]), ("'tokn'", "'token'")),
    (dict(bits=[3, 4]), ("3", "[2, 4, 8, 16]")),
    (dict(bits=[16]), ("[16]", "'channel'")),
    (dict(group_size=[0]), ("group_size 0",)),
    (dict(group_size=[100]), ("100",)),
    (dict(k_mode=["channel", "none"], v_mode=["none"]), ("'channel'", "'none'")),
    (dict(k_mode=["none"], v_mode=["none"]), ("[2]", "'none'")),  # the default bits 4,2: no 2-bit float format
])
def test_quantization_axes_take_what_some_backend_runs(overrides, words):
    with pytest.raises(ValueError) as err:
        make_spec(None, **overrides)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_quantization_axes_follow_the_int_formats():
    from foscar import config

    from suite.cases import FLOAT_BITS, GROUP_SIZES, INT_BITS, MODES

    assert (INT_BITS, GROUP_SIZES, MODES) == (config.BITS, config.GROUP_SIZES, config.MODES)
    for backend in select_backends(None):
        assert backend.bits in ((0, *INT_BITS) if backend.quantized else FLOAT_BITS), backend.name


def test_preset_with_an_unknown_mode_names_file_and_key(tmp_path):
    preset = tmp_path / "modes.toml"
    preset.write_text('[sweep]\nk_mode = ["token", "tokn"]\n')
    with pytest.raises(ValueError, match=r"modes.toml: k_mode .*'tokn'"):
        load_preset(str(preset))


def test_full_precision_reproducers_still_parse():
    # a BF16/FP8/NVFP4 backend's reproducer spells its own case: modes none, group 0, its width
    for bits in (16, 8, 4):
        [case] = expand(make_spec(None, batch=[1], kv_len=[1024], bits=[bits], k_mode=["none"], v_mode=["none"],
                                  group_size=[0]))
        assert (case.bits, case.k_mode, case.group_size) == (bits, "none", 0)


@pytest.mark.parametrize("group, page, rounded", [(32, 16, 64), (64, 100, 128), (128, 64, 128), (32, 96, 128),
                                                  (128, 256, 256)])
def test_quantized_pages_hold_whole_groups_and_64_token_blocks(group, page, rounded):
    for name in ("foscar-int4", "torch-ref", "bitdecoding-int4"):
        [backend] = select_backends([name])
        own = backend.case_for(Case(batch=1, kv_len=1024, group_size=group, page_size=page))
        assert own.page_size == rounded, (name, group, page)
        assert backend.case_for(own) == own  # its reproducer maps onto itself


def test_torch_ref_refuses_what_the_quantizer_refuses():
    from baselines.base import GpuInfo

    [ref] = select_backends(["torch-ref"])
    good = ref.case_for(Case(batch=1, kv_len=1024))
    assert ref.case_reason(good, GpuInfo.cpu()) is None
    assert "k_mode='tokn'" in ref.supports(good.with_(k_mode="tokn"), GpuInfo.cpu())
    assert "head_dim=96" in ref.supports(good.with_(head_dim=96), GpuInfo.cpu())
    assert "page_size=96" in ref.supports(good.with_(page_size=96), GpuInfo.cpu())


def test_empty_lists_and_unpaired_backends_are_named():
    from suite.cases import unpaired

    with pytest.raises(ValueError, match="--batch '' names no value"):
        parse_int_list("", "--batch")
    with pytest.raises(ValueError, match="--model ' , ' names nothing"):
        parse_str_list(" , ", "--model")
    cases = expand(make_spec(None, batch=[1], kv_len=[1024], bits=[4]))
    backends = select_backends(["foscar-int2", "foscar-int4", "trtllm-nvfp4"])
    assert unpaired(cases, backends) == ["foscar-int2 (it runs 2-bit cases only; the sweep's bits are [4])"]
    bf16 = expand(make_spec(None, batch=[1], kv_len=[1024], bits=[16], k_mode=["none"], v_mode=["none"]))
    assert unpaired(bf16, select_backends(["torch-ref"])) == ["torch-ref (an int format; every case has k_mode 'none')"]
