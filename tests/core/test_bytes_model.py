"""The byte model against hand-computed counts, one format at a time (decimal units)."""
import pytest

from core import bytes_model as bm
from core.case import Case

# The paper point: B=128, KV=32768, 32 query / 8 KV heads, d=128, page 64.
PAPER = dict(batch=128, kv_len=32768, num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=64)
ELEMS = 128 * 32768 * 8 * 128  # of K, and again of V: 4,294,967,296
QO = 128 * 32 * 128 * 2  # Q or O in BF16: 1,048,576 bytes
META = 128 * 512 * 4 + 128 * 4  # 512 pages of 64 per sequence, int32, plus seq_lens


def test_bf16_paper_case():
    t = bm.traffic("bf16", **PAPER)
    assert t.kv_codes == 17_179_869_184  # 2 tensors x 4,294,967,296 x 2 bytes
    assert (t.kv_params, t.kv_tail) == (0, 0)
    assert t.q == t.o == QO == 1_048_576
    assert t.metadata == 262_656
    assert t.total == 17_179_869_184 + 2 * 1_048_576 + 262_656
    assert t.flops == 4 * 128 * 32 * 32768 * 128


def test_bf16_matches_foscar_md_figure():
    # FOSCAR.md section 7: FlashInfer BF16 at 3.86 ms is 4.45 TB/s, 92.5% of 4.81.
    t = bm.traffic("bf16", **PAPER)
    tbps = bm.eff_bandwidth_tbps(t.total, 3860.0)
    assert tbps == pytest.approx(4.45, abs=0.01)
    assert bm.fraction(tbps, bm.bus_peak_tbps(3201, 6016)) == pytest.approx(0.925, abs=0.003)


def test_fp8():
    t = bm.traffic("fp8", **PAPER)
    assert t.kv_codes == 8_589_934_592
    assert t.kv_params == 0  # per-tensor scales: a few bytes, not counted
    # XQA at 1.99 ms: 4.32 TB/s (FOSCAR.md says 4.33 counting KV only, 90%)
    assert bm.eff_bandwidth_tbps(t.total, 1990.0) == pytest.approx(4.318, abs=0.002)


def test_nvfp4():
    t = bm.traffic("nvfp4", **PAPER)
    assert t.kv_codes == 4_294_967_296  # half a byte per element, K and V
    assert t.kv_params == 536_870_912  # one E4M3 byte per 16 elements: 2 x ELEMS / 16
    assert t.kv_total == 4_831_838_208


def test_int4_channel_k_token_v_group128_no_tail():
    t = bm.traffic("int", bits=4, group_size=128, k_mode="channel", v_mode="token", **PAPER)
    assert t.kv_codes == 4_294_967_296  # 2 x ELEMS / 2
    # (scale, offset) fp16 pairs: ELEMS/128 groups per tensor, 4 bytes each, 2 tensors
    assert t.kv_params == 2 * (ELEMS // 128) * 4 == 268_435_456
    assert t.kv_tail == 0  # 32768 is a multiple of 128
    # BitDecoding INT4 at 2.06 ms (FOSCAR.md section 7): 2.21 TB/s
    assert bm.eff_bandwidth_tbps(t.kv_total, 2060.0) == pytest.approx(2.21, abs=0.01)


def test_int2_paper_case():
    t = bm.traffic("int", bits=2, group_size=128, k_mode="channel", v_mode="token", **PAPER)
    assert t.kv_codes == 2_147_483_648
    assert t.kv_params == 268_435_456
    assert bm.eff_bandwidth_tbps(t.kv_total, 1890.0) == pytest.approx(1.28, abs=0.01)


def test_int_with_bf16_tail_small_case():
    # batch 2, kv 300, 4 query / 2 KV heads, d 64, INT4 g32, K channel-wise: tail 300 % 32 = 12
    t = bm.traffic("int", batch=2, kv_len=300, num_q_heads=4, num_kv_heads=2, head_dim=64,
                   page_size=64, bits=4, group_size=32, k_mode="channel", v_mode="token")
    packed = 2 * 288 * 2 * 64  # 73,728 elements of K (and of V) in packed pages
    assert t.kv_codes == 2 * packed // 2 == 73_728
    assert t.kv_params == 2 * (packed // 32) * 2 * 2 == 18_432
    assert t.kv_tail == 2 * 2 * 12 * 2 * 64 * 2 == 12_288
    assert t.q == t.o == 2 * 4 * 64 * 2 == 1_024
    assert t.metadata == 2 * 5 * 4 + 2 * 4 == 48  # ceil(300 / 64) = 5 pages
    assert t.total == 73_728 + 18_432 + 12_288 + 2 * 1_024 + 48


def test_int_token_token_has_no_tail_and_fp32_params():
    t = bm.traffic("int", batch=1, kv_len=100, num_q_heads=8, num_kv_heads=8, head_dim=128,
                   page_size=128, bits=2, group_size=64, k_mode="token", v_mode="token", param_bytes=4)
    packed = 100 * 8 * 128  # 102,400
    assert t.kv_tail == 0
    assert t.kv_codes == 2 * packed * 2 // 8 == 51_200
    assert t.kv_params == 2 * (packed // 64) * 2 * 4 == 25_600


def test_fp16_counts_like_bf16():
    a = bm.traffic("fp16", **PAPER)
    b = bm.traffic("bf16", **PAPER)
    assert a.total == b.total


def test_bad_formats():
    with pytest.raises(ValueError, match="unknown"):
        bm.traffic("int3", **PAPER)
    with pytest.raises(ValueError, match="bits"):
        bm.traffic("int", bits=3, group_size=128, k_mode="channel", v_mode="token", **PAPER)


def test_traffic_for_case_and_backend():
    from baselines.base import get_backend

    case = Case(batch=128, kv_len=32768, bits=4, group_size=128)
    assert bm.traffic_for_case(case, "int").kv_codes == 4_294_967_296
    assert bm.traffic_for_case(case, "nvfp4").kv_params == 536_870_912
    nvfp4 = get_backend("flashinfer-nvfp4-tc")  # its declared kv_format, through the base class
    assert nvfp4.traffic(nvfp4.case_for(case)).kv_params == 536_870_912


def test_peaks():
    assert bm.bus_peak_tbps(3201, 6016) == pytest.approx(4.8143, abs=1e-4)  # H200
    assert bm.bus_peak_tbps(2619, 5120) == pytest.approx(3.352, abs=1e-3)  # H100 SXM
    assert bm.bus_peak_tbps(None, 6016) is None
    assert bm.datasheet_peak_tbps("NVIDIA H200") == 4.8
    assert bm.datasheet_peak_tbps("NVIDIA H100 80GB HBM3") == 3.35
    assert bm.datasheet_peak_tbps("NVIDIA B200") == 8.0
    assert bm.datasheet_peak_tbps("NVIDIA A100-SXM4-80GB") == pytest.approx(2.039)
    assert bm.datasheet_peak_tbps("NVIDIA GeForce RTX 4090") is None
    assert bm.eff_bandwidth_tbps(1e12, 1e6) == pytest.approx(1.0)  # 1 TB in 1 s
    assert bm.eff_bandwidth_tbps(100, None) is None
    assert bm.fraction(None, 4.8) is None


def test_datasheet_peak_matches_the_most_specific_name_first():
    from core.bytes_model import datasheet_peak_tbps

    assert datasheet_peak_tbps("NVIDIA H200") == 4.8
    assert datasheet_peak_tbps("NVIDIA GH200 480GB") == 4.0
    assert datasheet_peak_tbps("NVIDIA H100 80GB HBM3") == 3.35
    assert datasheet_peak_tbps("Some Other GPU") is None
