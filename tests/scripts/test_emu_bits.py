"""scripts/emu_bits.py: the emulator's outputs over fixed cases, compared bit for bit between two
trees (here one tree against itself, and against a copy with one bit moved)."""
from __future__ import annotations


import pytest
import torch

from foscar import emu
from foscar.build import BuildError

@pytest.fixture(scope="module")
def m(script):
    return script("emu_bits")


def test_case_set_covers_every_width_group_mode_and_plan(m):
    every = m.cases()
    assert len(every) == 2 * 3 * 2 * 2 * 2 * 2 and len(set(every)) == len(every)
    assert {c[2] for c in every} == {"channel"} and {c[2] for c in m.cases(all_modes=True)} == {"token", "channel"}
    assert {c[6] for c in every} == {132, 1}


def test_a_run_equals_itself_and_a_moved_bit_is_found(tmp_path, capsys, m):
    try:
        emu.find_cxx()
    except BuildError as exc:
        pytest.skip(f"no host C++ compiler to build the emulator: {exc}")
    chosen = m.cases(bits=(2,), groups=(128,), sms=(1,))[:2]
    first, again = m.run(chosen), m.run(chosen)
    assert m.compare(first, again) == []  # the same draw and kernels: the same bits
    moved = {k: v.clone() for k, v in again.items()}
    key = chosen[1]
    moved[key].view(torch.int16).view(-1)[5] ^= 1  # one bit of one output element
    assert m.compare(first, moved) == [key]
    del moved[chosen[0]]
    assert m.compare(first, moved) == sorted(chosen, key=str)
    torch.save(first, tmp_path / "a.pt")
    torch.save(moved, tmp_path / "b.pt")
    assert m.main(["compare", str(tmp_path / "a.pt"), str(tmp_path / "a.pt")]) == 0
    assert m.main(["compare", str(tmp_path / "a.pt"), str(tmp_path / "b.pt")]) == 1
    assert "2 cases; 2 differ" in capsys.readouterr().out


def test_a_knob_the_sources_never_test_is_refused_by_name(tmp_path, m, capsys):
    out = tmp_path / "never.pt"
    with pytest.raises(SystemExit) as exc:
        m.main(["run", str(out), "--define=-DFOSCAR_NO_SUCH_KNOB=1"])
    assert exc.value.code == 2
    assert "FOSCAR_NO_SUCH_KNOB" in capsys.readouterr().err and not out.exists()
