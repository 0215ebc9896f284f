"""Does a kernel change keep every output bit? The CPU emulator (foscar.emu) run over a fixed set
of cases, and two such runs compared bit for bit: a change that should not move the arithmetic
(a new schedule, other warps doing the same work) must return the old output to the last bit,
which the tests' float64 gate (4e-3) cannot tell.

    PYTHONPATH=<old tree> python3 scripts/emu_bits.py run /tmp/old.pt
    PYTHONPATH=<new tree> python3 scripts/emu_bits.py run /tmp/new.pt
    python3 scripts/emu_bits.py compare /tmp/old.pt /tmp/new.pt
    python3 scripts/emu_bits.py run /tmp/knob.pt --define=-DFOSCAR_PV_SPLIT=1   # with a lab knob

`run` takes the emulator of whichever foscar it imports (its csrc), so each tree runs its own
kernels. The cases: both widths, groups of 32, 64 and 128, the V modes with K channel-wise (or
every K/V mode with --all-modes), one KV head per item and paired, one and three splits, the
split plan of an H200 (132 SMs) and of one SM (each CTA runs many items, some empty). The
thirteenth and fourteenth sessions compared v32b-d to v31 this way (docs/PERFORMANCE.md).
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

# After PYTHONPATH, so that PYTHONPATH=<tree> picks the tree whose kernels run.
sys.path.append(str(Path(__file__).resolve().parents[1]))

Case = tuple  # (bits, group, k_mode, v_mode, kv_heads_per_item, splits, num_sms)


def cases(all_modes: bool = False, bits=(4, 2), groups=(32, 64, 128), sms=(132, 1)) -> list[Case]:
    k_modes = ("token", "channel") if all_modes else ("channel",)
    return [(b, g, km, vm, hpi, splits, n) for b, g, km, vm, hpi, splits, n in
            itertools.product(bits, groups, k_modes, ("token", "channel"), (1, 2), (1, 3), sms)]


def run(case_list: list[Case], defines: tuple[str, ...] = ()) -> dict[Case, torch.Tensor]:
    """Each case's output, from shapes and data drawn from the case alone (the same in any tree),
    the emulator built with the kernel knobs `defines`."""
    from foscar import emu
    from foscar.testcases import case_inputs, gpu_case

    out: dict[Case, torch.Tensor] = {}
    for b, g, km, vm, hpi, splits, n in case_list:
        config, lens, nkv, ratio = gpu_case(b, g, km, vm, 100 + 7 * b + g + hpi, batch=2, ratio=4)
        nkv = max(nkv, 2)  # a paired item needs two KV heads
        q, cache = case_inputs(config, lens, nkv, ratio, 100 + g + b)
        out[(b, g, km, vm, hpi, splits, n)] = emu.decode(q, cache, num_splits=splits, kv_heads_per_item=hpi,
                                                         num_sms=n, defines=defines).clone()
        print(b, g, km, vm, hpi, splits, n, lens, flush=True)
    return out


def compare(a: dict[Case, torch.Tensor], b: dict[Case, torch.Tensor]) -> list[Case]:
    """The cases whose outputs differ in any bit (a case missing from either side differs)."""
    return [k for k in sorted(set(a) | set(b), key=str)
            if k not in a or k not in b or not torch.equal(a[k].view(torch.int16), b[k].view(torch.int16))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the cases through this tree's emulator; save the outputs")
    r.add_argument("out", type=Path)
    r.add_argument("--all-modes", action="store_true", help="K token-wise too (default: K channel-wise)")
    r.add_argument("--define", action="append", default=[], metavar="-DFOSCAR_NAME=VALUE",
                   help="a kernel knob for the emulator's build (repeatable)")
    c = sub.add_parser("compare", help="compare two runs bit for bit")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        import foscar
        print(f"the kernels of {Path(foscar.__file__).resolve().parent / 'csrc'}", flush=True)
        from foscar import emu
        from foscar.build import BuildError
        try:  # the emulator's own build refuses a knob the sources never test, before any case runs
            emu.load(args.define)
        except BuildError as e:
            ap.error(str(e))
        torch.save(run(cases(args.all_modes), tuple(args.define)), args.out)
        return 0
    for path in (args.a, args.b):
        if not path.exists():
            ap.error(f"{path} does not exist; make it with `emu_bits.py run {path}`.")
    a, b = torch.load(args.a), torch.load(args.b)
    bad = compare(a, b)
    print(f"{len(set(a) | set(b))} cases; {len(bad)} differ" + (f": {bad[:10]}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
