"""scripts/emu_steal_stress.py: random cases of lab knob FOSCAR_STEAL against the reference, two
CTAs at once, for a second (the emulator build the stolen-tail tests use)."""
from __future__ import annotations

import pytest

from foscar import emu
from foscar.build import BuildError


def test_a_second_of_random_cases_passes(script, monkeypatch, capsys):
    try:
        emu.find_cxx()
    except BuildError as exc:
        pytest.skip(f"no host C++ compiler to build the emulator: {exc}")
    monkeypatch.setenv("FOSCAR_EMU_CONCURRENT_CTAS", "2")
    stress = script("emu_steal_stress")
    assert stress.main(["--seconds", "1", "--seed", "5", "--defines", "-DFOSCAR_STEAL=1 -DFOSCAR_TIMELINE=1"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("0 outside the gate") and not out.startswith("0 cases")
    with pytest.raises(SystemExit):
        stress.main(["--defines", "-DFOSCAR_TIMELINE=1"])
