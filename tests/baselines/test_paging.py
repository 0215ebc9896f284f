"""Page tables, paged views and the FP8 / NVFP4 conversions the adapters share."""
import pytest
import torch

from baselines import _paging as pg


def test_page_table_and_view():
    pt = pg.page_table(3, 100, 64, "cpu")
    assert pt.indptr.tolist() == [0, 2, 4, 6]
    assert pt.last_page_len.tolist() == [36, 36, 36]
    assert pt.block_tables.tolist() == [[0, 1], [2, 3], [4, 5]]
    x = torch.randn(2, 128, 3, 8)
    v = pg.paged_view(x, 64)
    assert v.shape == (4, 64, 3, 8) and v.data_ptr() == x.data_ptr()  # no copy
    assert torch.equal(v[1], x[0, 64:])
    padded = pg.paged_view(torch.randn(2, 100, 3, 8), 64)
    assert padded.shape == (4, 64, 3, 8) and torch.all(padded[1, 36:] == 0)


def test_fp8_round_trip():
    x = torch.randn(4, 64, 2, 16).bfloat16()
    x8, scale = pg.fp8_quantize(x)
    assert x8.dtype == torch.float8_e4m3fn
    assert scale == pytest.approx(float(x.abs().max()) / 448)
    err = (pg.fp8_dequantize(x8, scale) - x.float()).norm() / x.float().norm()
    assert err < 0.05


def test_nvfp4_round_trip_and_layout():
    x = torch.randn(3, 5, 128)
    packed, scales, g = pg.nvfp4_quantize(x)
    assert packed.shape == (3, 5, 64) and packed.dtype == torch.uint8
    assert scales.shape == (3, 5, 8) and scales.dtype == torch.float8_e4m3fn
    y = pg.nvfp4_dequantize(packed, scales, g)
    assert float((y - x).norm() / x.norm()) < 0.15
    # the low nibble holds the element with the lower index
    one = torch.zeros(1, 16)
    one[0, 0], one[0, 1] = 6.0, -0.5
    p, s, g1 = pg.nvfp4_quantize(one)
    assert int(p[0, 0]) & 0xF == 0x7 and int(p[0, 0]) >> 4 == 0x8 | 0x1
    c_packed, c_scales, c_g = pg.nvfp4_quantize_chunked(x, rows=4)
    assert torch.equal(c_packed, packed) and c_g == g
