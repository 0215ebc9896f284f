"""scripts/bitdecoding_probe.py on the CPU against a stand-in library: a faithful one reads
back exactly and matches its min-max reference; one whose codes land on the wrong channels,
or whose groups differ, is told apart."""
import importlib.util
from pathlib import Path

import pytest
import torch

from bitdecoding_standin import standin

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bitdecoding_probe", ROOT / "scripts" / "bitdecoding_probe.py")
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)

CPU = torch.device("cpu")
HEADS = (8, 2)
READ = 128  # one INT4 block; the GPU run reads 256 (one INT2 block)


@pytest.mark.parametrize("bits", [4, 2])
def test_a_faithful_library_reads_back_exactly(bits):
    bd = standin()
    lay = probe.layout(bd, bits, 128, HEADS, CPU, READ)
    assert lay["v"]["misplaced"] == 0 and lay["k"]["misplaced"] == 0
    val = probe.values(bd, bits, 128, HEADS, CPU, read_len=READ)
    assert val["v_within_0.1_step"] == 1.0 and val["k_within_0.1_step"] > 0.999, val
    err = probe.errors(bd, bits, 128, HEADS, batch=1, kv_len=512, device=CPU)
    assert err["bitdecoding_vs_minmax"] < 0.02 * err["minmax_vs_exact"]
    res = {"errors": err, "layout": lay, "values": val}
    assert probe.verdict(res).startswith("BitDecoding computes its min-max quantizer's attention")


def test_misplaced_codes_are_found_and_named():
    bd = standin(layout_bug=True)
    lay = probe.layout(bd, 2, 128, HEADS, CPU, READ)
    assert lay["v"]["misplaced"] == READ * 2 and lay["k"]["misplaced"] is None
    token, channel, came_back = lay["v"]["first_misplaced (token, channel, came back at)"][0]
    assert (token, channel, came_back) == (0, 0, 7)  # reversed within 8 channels
    err = probe.errors(bd, 2, 128, HEADS, batch=1, kv_len=512, device=CPU)
    assert err["bitdecoding_vs_minmax"] > 0.5  # the size of the error seen on the H200
    res = {"errors": err, "layout": lay, "values": probe.values(bd, 2, 128, HEADS, CPU, read_len=READ)}
    assert "wrong token or channel" in probe.verdict(res)


def test_another_group_is_seen_in_the_values():
    bd = standin(group_bug=64)
    res = {"errors": probe.errors(bd, 2, 128, HEADS, batch=1, kv_len=512, device=CPU),
           "layout": probe.layout(bd, 2, 128, HEADS, CPU, READ), "values": probe.values(bd, 2, 128, HEADS, CPU, read_len=READ)}
    assert res["layout"]["v"]["misplaced"] == 0
    assert res["values"]["v_within_0.1_step"] < 0.9
    assert "values differ" in probe.verdict(res)
