"""scripts/precision_table.py --pv-chains: the CPU model's error with PV chained over one k-step,
two, or a warp's split, as docs/PERFORMANCE.md quotes it (twelfth session)."""
from __future__ import annotations


def test_pv_chain_table_rows(capsys, script):
    module = script("precision_table")
    module.pv_chain_table([2048])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2K")]
    assert [line.split(" | ")[1] for line in lines] == ["INT4", "INT2"]
    for line in lines:
        errs = [float(x) for x in line.strip(" |").split(" | ")[2:]]
        assert len(errs) == 6
        # two chained k-steps keep one k-step's error; every form is under the gate at 2K tokens
        assert abs(errs[1] - errs[0]) <= 0.02 * errs[0] and max(errs) < 4e-3
