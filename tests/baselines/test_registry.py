"""The backend registry and every backend's declaration, with no optional library here."""
import pytest

from baselines.base import GpuInfo, all_backends, get_backend, select_backends
from core.case import Case

EXPECTED = {
    "torch-ref", "flashinfer-bf16", "flashinfer-bf16-tc", "flashinfer-bf16-fa3", "flashinfer-fp8",
    "flashinfer-fp8-tc", "flashinfer-nvfp4-tc", "trtllm-xqa-fp8", "trtllm-nvfp4", "bitdecoding-int4",
    "bitdecoding-int2", "foscar-int4", "foscar-int2", "foscar-dequant-int4", "foscar-dequant-int2",
}
H200 = GpuInfo(index=0, name="NVIDIA H200", capability=(9, 0), sm_count=132, l2_bytes=60 << 20)
B200 = GpuInfo(index=0, name="NVIDIA B200", capability=(10, 0))


def test_registry_lists_every_backend():
    # The product's backends only: the harness's stand-ins live in tests/suite/.
    assert {b.name for b in all_backends()} == EXPECTED
    with pytest.raises(KeyError) as err:
        get_backend("test-crash")
    assert "test-" not in str(err.value).split("expected one of")[1]


def test_every_backend_declares_its_format():
    from core.bytes_model import FORMATS

    for b in all_backends():
        assert b.kv_format in FORMATS and b.bits in (0, 2, 4, 8, 16), b.name
        # subclasses say why in case_reason (and available); supports() stays the base's
        assert "supports" not in vars(type(b)), f"{b.name} overrides supports(); override case_reason"
        assert b.traffic(Case(batch=1, kv_len=1024, bits=b.bits if b.bits in (2, 4) else 4)).total > 0


def test_register_checks_the_declaration():
    from baselines.base import Backend, register

    class NoFormat(Backend):
        name = "no-format"

    with pytest.raises(ValueError, match="kv_format"):
        register(NoFormat)


def test_get_and_select():
    assert get_backend("trtllm-xqa-fp8").family == "trtllm"
    with pytest.raises(KeyError, match="expected one of"):
        get_backend("nope")
    assert [b.name for b in select_backends(["bitdecoding-*"])] == ["bitdecoding-int4", "bitdecoding-int2"]
    with pytest.raises(KeyError):
        select_backends(["zzz*"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_supports_never_raises_and_gives_reasons(name):
    b = get_backend(name)
    case = b.case_for(Case(batch=4, kv_len=1024, bits=b.bits if b.bits in (2, 4) else 4))
    assert case is not None
    for gpu in (H200, B200, None):
        reason = b.supports(case, gpu)
        assert reason is None or (isinstance(reason, str) and len(reason) > 10)
    assert b.tolerance > 0 and b.description and b.family


def test_missing_libraries_say_how_to_get_them():
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        assert "pip install flashinfer-python" in get_backend("flashinfer-bf16-tc").supports(
            Case(batch=1, kv_len=1024, bits=16, k_mode="none", v_mode="none", group_size=0), H200)
    try:
        import bit_decode  # noqa: F401
    except ImportError:
        reason = get_backend("bitdecoding-int4").supports(Case(batch=1, kv_len=1024), H200)
        assert "git clone --recursive https://github.com/DD-DuDa/BitDecoding" in reason


def test_nvfp4_trtllm_needs_blackwell():
    b = get_backend("trtllm-nvfp4")
    case = b.case_for(Case(batch=1, kv_len=1024))
    assert "Blackwell" in b.supports(case, H200) and "sm_90" in b.supports(case, H200)


def test_fa3_is_hopper_only(monkeypatch):
    import baselines.flashinfer_decode as fd

    monkeypatch.setattr(fd, "has_module", lambda name: True)
    b = get_backend("flashinfer-bf16-fa3")
    case = b.case_for(Case(batch=1, kv_len=1024))
    assert b.supports(case, H200) is None
    assert "sm_90" in b.supports(case, B200)


def test_case_for_normalisation():
    int4 = Case(batch=1, kv_len=1024, bits=4, page_size=64)
    int2 = int4.with_(bits=2)
    fi = get_backend("flashinfer-bf16")
    assert fi.case_for(int4) == fi.case_for(int2)
    assert fi.case_for(int4).bits == 16 and fi.case_for(int4).k_mode == "none"
    assert get_backend("trtllm-xqa-fp8").case_for(int4).bits == 8
    assert get_backend("foscar-int4").case_for(int2) is None
    assert get_backend("foscar-int4").case_for(int4).page_size == 128
    assert get_backend("torch-ref").case_for(int2).bits == 2
    assert get_backend("flashinfer-nvfp4-tc").case_for(int2) is None
    assert get_backend("flashinfer-nvfp4-tc").case_for(int4).bits == 4


def test_foscar_kernel_reasons_are_passed_through():
    # head_dim 64 is a valid cache but not a built kernel: supports() says so, naming it.
    case = Case(batch=1, kv_len=1024, head_dim=64, page_size=128)
    reason = get_backend("foscar-int4").supports(case, None)
    assert reason is not None and "head_dim=64" in reason


def test_foscar_backends_take_the_launch_plans_split_count():
    # prepare() reads num_splits on every FOSCAR backend; only the lab's variants force one.
    from baselines.foscar import FoscarVariant

    for name in ("foscar-int4", "foscar-int2", "foscar-dequant-int4", "foscar-dequant-int2"):
        assert get_backend(name).num_splits is None, name
    assert FoscarVariant("lab", 4, library=None, num_splits=8).num_splits == 8
