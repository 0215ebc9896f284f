"""scripts/sass_same.py: kernels fingerprinted without addresses, loops with registers renamed,
and each kernel of a new library matched to the first reference that holds it."""
from __future__ import annotations

import pytest


def listing(name: str, body: list[str], base: int = 0) -> str:
    """A cuobjdump -sass listing of one function, its instructions from address `base`."""
    lines = [f"\t\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90\""]
    lines += [f"        /*{base + 16 * i:04x}*/                   {text} ;" for i, text in enumerate(body)]
    return "\n".join(lines) + "\n"


LOOP = ["S2R R0, SR_TID.X", "LOP3.LUT R1, R2, 0xf, R3, 0xea, !PT", "HMMA.16816.F32 R4, R8, R12, RZ",
        "@P0 BRA {back}", "EXIT"]


def kernel(base: int = 0, regs: tuple[str, str] = ("R1", "R2"), swap: bool = False) -> list[str]:
    body = [line.replace("R1,", f"{regs[0]},").replace("R2,", f"{regs[1]},") for line in LOOP]
    if swap:  # the loop's two instructions in the other order: a new schedule
        body[1], body[2] = body[2], body[1]
    body[3] = body[3].format(back=hex(base + 0x10))  # the loop's head, an absolute address
    return body


@pytest.fixture(scope="module")
def mod(script):
    return script("sass_same")


def test_moved_code_is_the_same_kernel(mod):
    a = mod.fingerprints(listing("k", kernel()))
    b = mod.fingerprints(listing("k", kernel(base=0x100), base=0x100))
    assert a == b and a["k"][1] == 5


def test_renamed_registers_match_only_when_renaming(mod):
    a, b = listing("k", kernel()), listing("k", kernel(regs=("R7", "R9")))
    assert mod.fingerprints(a) != mod.fingerprints(b)
    assert mod.fingerprints(a, loop=True) != mod.fingerprints(b, loop=True)
    assert mod.fingerprints(a, loop=True, rename=True) == mod.fingerprints(b, loop=True, rename=True)
    loop = mod.fingerprints(a, loop=True)["k"]
    assert loop[1] == 3  # LOP3, HMMA and the branch back: S2R and EXIT are outside the loop


def test_a_rescheduled_loop_differs_even_renamed(mod):
    a, b = listing("k", kernel()), listing("k", kernel(swap=True))
    assert mod.fingerprints(a, loop=True, rename=True) != mod.fingerprints(b, loop=True, rename=True)


def test_classify_names_the_first_reference_holding_each_kernel(mod):
    new = mod.fingerprints(listing("one", kernel()) + listing("two", kernel(swap=True)) + listing("three", kernel()))
    ref1 = mod.fingerprints(listing("one", kernel(base=0x40), base=0x40) + listing("two", kernel()))
    ref2 = mod.fingerprints(listing("one", kernel()) + listing("two", kernel(swap=True)))
    verdict = mod.classify(new, [("ref1", ref1), ("ref2", ref2)])
    assert verdict == {"one": "ref1", "two": "ref2", "three": "new"}  # "three" is in neither


def test_a_missing_library_is_named(mod, tmp_path, monkeypatch):
    monkeypatch.setenv("FOSCAR_CACHE_DIR", str(tmp_path))
    with pytest.raises(SystemExit, match="'0123abcd' is neither a file nor a build key under"):
        mod.resolve("0123abcd")
    lib = tmp_path / "sm_90a-0123abcd" / "libfoscar.so"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    assert mod.resolve("0123abcd") == lib
