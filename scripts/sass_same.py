"""Which kernels of a library are instruction for instruction those of libraries already measured.

A kernel source edit that leaves a kernel's SASS unchanged leaves its timing unchanged, so a
library whose every kernel matches one timed before is measured already (v44's tidies, v45:
docs/PERFORMANCE.md). Each kernel is fingerprinted by its instructions in order, with addresses
dropped and branch targets taken relative to the instruction, so code that only moved compares
equal. --loop fingerprints the main loop alone (suite.alu.sass picks it, as `foscar-bench alu
--static` does), and --rename names registers by first use, so that a loop ptxas only renamed
compares equal while one it rescheduled does not.

    python scripts/sass_same.py NEW REF [REF ...] [--loop [--rename]] [--all]

NEW and each REF are a libfoscar.so (or cubin), or a build key of the kernel cache
(FOSCAR_CACHE_DIR, else ~/.cache/foscar; e.g. 576895a7ef1e19a5). Prints, per kernel of NEW, the
first REF it matches (or "new"), then the count per REF; --all lists every kernel, not only the
summary and the unmatched ones. Exit 0 when every kernel matched some REF, 1 otherwise.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from foscar.build import cache_dir  # noqa: E402  (FOSCAR_CACHE_DIR, else ~/.cache/foscar)
from suite.alu import sass  # noqa: E402

_REG = re.compile(r"\b(U?R|U?P)(\d+)\b")  # R12, UR4, P0, UP1 (RZ, PT, URZ, UPT have no digits)


def resolve(arg: str) -> Path:
    """A library path as given, or the libfoscar.so of cache key `arg`."""
    if os.path.exists(arg):
        return Path(arg)
    root = cache_dir()
    hits = sorted(root.glob(f"*-{arg}/libfoscar.so"))
    if not hits:
        raise SystemExit(f"sass_same.py: {arg!r} is neither a file nor a build key under {root}; "
                         "pass a libfoscar.so path or build it first (foscar-bench build).")
    return hits[0]


def fingerprint(func: sass.Function, loop: bool = False, rename: bool = False) -> tuple[str, int]:
    """(hash, instruction count) of a function, or of its main loop with `loop`."""
    body = func.instructions
    if loop:
        body = sass.body(func, sass.main_loop(func))
    lines = []
    for ins in body:
        operands = ins.operands if ins.target is None else f"{ins.target - ins.addr:+d}"
        lines.append(f"{ins.predicate or ''} {ins.mnemonic} {operands}")
    text = "\n".join(lines)
    if rename:
        names: dict[str, str] = {}
        text = _REG.sub(lambda m: names.setdefault(m.group(0), f"{m.group(1)}#{len(names)}"), text)
    return hashlib.sha1(text.encode()).hexdigest()[:12], len(body)


def fingerprints(sass_text: str, loop: bool = False, rename: bool = False) -> dict[str, tuple[str, int]]:
    return {f.name: fingerprint(f, loop, rename) for f in sass.parse_sass(sass_text)}


def classify(new: dict, refs: list[tuple[str, dict]]) -> dict[str, str]:
    """Per kernel of `new`, the label of the first reference holding it with the same
    fingerprint, or "new" (also where no reference has the kernel at all)."""
    out = {}
    for name, fp in new.items():
        out[name] = next((label for label, ref in refs if ref.get(name) == fp), "new")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new")
    ap.add_argument("refs", nargs="+")
    ap.add_argument("--loop", action="store_true", help="the main loop only")
    ap.add_argument("--rename", action="store_true", help="registers named by first use (with --loop)")
    ap.add_argument("--all", action="store_true", help="list every kernel")
    args = ap.parse_args(argv)
    prints = {a: fingerprints(sass.disassemble(resolve(a)), args.loop, args.rename) for a in [args.new, *args.refs]}
    verdict = classify(prints[args.new], [(r, prints[r]) for r in args.refs])
    for name, label in sorted(verdict.items()):
        if args.all or label == "new":
            print(f"{label:>20}  {name}  ({prints[args.new][name][1]} instructions)")
    counts = collections.Counter(verdict.values())
    what = "main loops" if args.loop else "kernels"
    print(f"{len(verdict)} {what}: " + ", ".join(f"{n} as {label}" for label, n in counts.most_common()))
    return 0 if counts["new"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
