"""Static instruction analysis: disassemble a cubin / shared library / fatbin with cuobjdump,
split it per kernel, find each kernel's main KV loop, and count its SASS by class and pipe.

How the main loop is found (no GPU, no source changes needed):
- a loop is the address range [target, branch] of a backward branch (BRA to a lower
  address; the `BRA self` trap after EXIT is not a loop); back-edges sharing one header
  are one loop; a loop "nests" another whose range lies inside its own;
- candidates are the loops holding tensor instructions (HMMA/HGMMA/...), ranked by
  1. whether their tensor instructions cover a whole multiple k of the KV elements one
     trip consumes (the caller's `elems_per_iter_per_thread`; k is ptxas's unroll),
  2. warpgroup MMAs (HGMMA, ...) of their own and no tensor work in nested loops: a wgmma main loop
     beats an mma.sync tail loop with as much tensor work and the item loop around it (which
     may own more tensor instructions: the first chunk's S), even when a rarely taken loop (a
     per-group rebuild) nests inside it,
  3. tensor instructions of their own (outside nested loops): a page loop around a tile
     loop owns none, a pipelined body beats its remainder loop, and an outer loop whose
     inner loops ptxas left rolled beats those inner loops,
  4. no nested loops at all, 5. LOP3s of their own (unpacking codes costs LOP3s; a BF16
     tail loop with as much tensor work has few), 6. the smaller body;
- without any tensor instruction in a loop, the largest loop.
Rivals ranked level on 1-2, nested loops and a metadata mismatch are reported as notes.
A kernel may fix the choice with markers: `asm volatile("pmevent 0;")` before the main
loop and `asm volatile("pmevent 1;")` after it compile to `PMTRIG` instructions, one issue
each outside the loop; with `marker=True` only loops between the first and last PMTRIG are
candidates. `loop=(start, end)` picks an address range outright.

Per element: a trip of the chosen loop body consumes `elems_per_iter_per_thread` KV
elements per thread times the unroll factor k. k is (tensor instructions in the body) /
`tensor_per_iter` when the caller says how many tensor instructions one source iteration
issues; else the whole ratio of the elements the body's tensor instructions cover to
`elems_per_iter_per_thread`; else 1. The elements tensor instructions cover come from their
shapes, KV being the A (M x K) operand as in our kernels: m16n8k16 and m64nNk16 take 8
16-bit elements per thread, the k32 8-bit shapes 16. A body whose tensor work does not
match the metadata gets a note. Per-element figures count issued instructions per thread:
predicated-off instructions count, as the warp issues them.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from suite.alu.isa import CLASSES, OpInfo, classify


class SassError(RuntimeError):
    """A disassembler is missing or failed; the message says which and what to do."""


# --- tools ---------------------------------------------------------------------------------


def _wheel_bin_dirs() -> list[Path]:
    """bin/ folders of NVIDIA's pip wheels (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)."""
    try:
        import nvidia  # namespace package of the nvidia-* wheels
    except ImportError:
        return []
    dirs = []
    for root in getattr(nvidia, "__path__", []):
        for sub in ("cu13/bin", "cu12/bin", "cuda_cuobjdump/bin", "cuda_nvdisasm/bin", "cuda_nvcc/bin"):
            if (Path(root) / sub).is_dir():
                dirs.append(Path(root) / sub)
    return dirs


def find_tool(name: str) -> Path | None:
    """A CUDA binary from $PATH, $CUDA_HOME/bin, /usr/local/cuda/bin or NVIDIA's pip wheels."""
    hit = shutil.which(name)
    if hit:
        return Path(hit)
    dirs = [Path(os.environ[v]) / "bin" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    dirs += [Path("/usr/local/cuda/bin"), *_wheel_bin_dirs()]
    for d in dirs:
        if (d / name).is_file() and os.access(d / name, os.X_OK):
            return d / name
    return None


def disassemble(binary: str | os.PathLike, arch: str | None = None) -> str:
    """`cuobjdump -sass` text of a cubin, fatbin, executable or shared library."""
    path = Path(binary)
    if not path.exists():
        raise SassError(f"{path} does not exist; build the kernels first or pass an existing --cubin.")
    cuobjdump = find_tool("cuobjdump")
    if cuobjdump is None:
        raise SassError(
            "cuobjdump was not found on PATH, in /usr/local/cuda/bin or in NVIDIA's pip wheels; "
            "install the CUDA toolkit or `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`."
        )
    env = dict(os.environ)
    nvdisasm = find_tool("nvdisasm")  # cuobjdump -sass calls nvdisasm for new architectures
    if nvdisasm is not None:
        env["PATH"] = f"{nvdisasm.parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [str(cuobjdump), "-sass"]
    if arch:
        cmd += ["-arch", arch]
    cmd.append(str(path))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise SassError(f"`{' '.join(cmd)}` failed: {(res.stderr or res.stdout).strip()[-2000:]}")
    if "Function" not in res.stdout:
        raise SassError(
            f"{path} holds no SASS{' for ' + arch if arch else ''} (only PTX, or no device code); "
            "build it with -gencode=arch=compute_90a,code=sm_90a."
        )
    return res.stdout


# --- parsing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    addr: int
    mnemonic: str  # opcode with modifiers, e.g. 'IMAD.WIDE.U32'
    operands: str
    predicate: str | None = None  # '@!P0' etc.; predicated-off instructions still issue
    target: int | None = None  # branch target address for BRA/BRX/JMP

    @property
    def opcode(self) -> str:
        return self.mnemonic.split(".")[0]

    @property
    def info(self) -> OpInfo:
        return classify(self.mnemonic)

    @property
    def text(self) -> str:
        pred = f"{self.predicate} " if self.predicate else ""
        return f"{pred}{self.mnemonic} {self.operands}".strip()


@dataclass
class Function:
    name: str
    arch: str | None
    instructions: list[Instruction] = field(default_factory=list)


_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
_ARCH = re.compile(r"code for (sm_\w+)|\.target\s+(sm_\w+)")
_NVD_FUNC = re.compile(r"^\s*\.text\.(\S+?):\s*$")
_LABEL = re.compile(r"^\s*(\.L_\w+):")
_INSN = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s+(.*?)\s*;?\s*(?:/\*.*\*/)?\s*$")
_PRED = re.compile(r"^(@!?U?P[T0-9]+)\s+")
_HEX_TARGET = re.compile(r"^(0x[0-9a-fA-F]+)\b")
_LABEL_TARGET = re.compile(r"`\(\s*(\.L_\w+)\s*\)")
_BRANCHES = {"BRA", "BRX", "JMP", "JMX", "CALL"}


def parse_sass(text: str) -> list[Function]:
    """Functions of a cuobjdump -sass (or nvdisasm) listing, in order of appearance."""
    funcs: list[Function] = []
    arch: str | None = None
    cur: Function | None = None
    labels: dict[str, int] = {}
    pending_labels: list[str] = []
    label_uses: list[tuple[Function, int, str, dict[str, int]]] = []
    for line in text.splitlines():
        if m := _ARCH.search(line):
            arch = m.group(1) or m.group(2)
        if (m := _FUNC.match(line)) or (m := _NVD_FUNC.match(line)):
            cur = Function(m.group(1), arch)
            funcs.append(cur)
            labels, pending_labels = {}, []
            continue
        if cur is None:
            continue
        if m := _LABEL.match(line):
            pending_labels.append(m.group(1))
            continue
        ins = parse_line(line)
        if ins is None:
            continue
        for lab in pending_labels:
            labels[lab] = ins.addr
        pending_labels = []
        if ins.opcode in _BRANCHES and ins.target is None:
            if tm := _LABEL_TARGET.search(ins.operands):
                label_uses.append((cur, len(cur.instructions), tm.group(1), labels))
        cur.instructions.append(ins)
    for func, idx, label, func_labels in label_uses:  # nvdisasm: `(.L_x_3) -> address
        if label in func_labels:
            func.instructions[idx] = Instruction(
                **{**asdict(func.instructions[idx]), "target": func_labels[label]}
            )
    for func in funcs:
        _trim_padding(func)
    return funcs


def parse_line(line: str) -> Instruction | None:
    """One `/*addr*/ [@pred] MNEMONIC operands ;` line, or None for anything else."""
    m = _INSN.match(line)
    if not m or not m.group(2) or m.group(2).startswith("0x"):
        return None  # the second half of a 128-bit instruction word is a bare hex comment
    addr, text = int(m.group(1), 16), m.group(2).strip().rstrip(";").strip()
    pred = None
    if pm := _PRED.match(text):
        pred, text = pm.group(1), text[pm.end():]
    mnemonic, _, operands = text.partition(" ")
    operands = operands.strip()
    target = None
    if mnemonic.split(".")[0] in _BRANCHES and (tm := _HEX_TARGET.match(operands)):
        target = int(tm.group(1), 16)
    return Instruction(addr, mnemonic, operands, pred, target)


def _trim_padding(func: Function) -> None:
    """Drop the never-executed tail: NOP padding and the `BRA self` trap after the last EXIT."""
    ins = func.instructions
    while ins and (ins[-1].opcode == "NOP" or (ins[-1].opcode == "BRA" and ins[-1].target == ins[-1].addr)):
        ins.pop()


# --- loops ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loop:
    start: int  # header address (branch target)
    end: int  # address of the (last) backward branch

    def contains(self, other: "Loop") -> bool:
        return self.start <= other.start and other.end <= self.end and self != other


def find_loops(func: Function) -> list[Loop]:
    """Natural-loop address ranges from backward branches, one per header."""
    by_header: dict[int, int] = {}
    for ins in func.instructions:
        if ins.target is not None and ins.target < ins.addr:
            by_header[ins.target] = max(ins.addr, by_header.get(ins.target, -1))
    return sorted((Loop(s, e) for s, e in by_header.items()), key=lambda lp: (lp.start, -lp.end))


def body(func: Function, loop: Loop | None) -> list[Instruction]:
    if loop is None:
        return list(func.instructions)
    return [i for i in func.instructions if loop.start <= i.addr <= loop.end]


def _successors(func: Function) -> list[list[int]]:
    """Each instruction's successors (indices) in the control flow: the next instruction unless
    it is an unconditional branch or exit, and a branch's target. An indirect branch (BRX, JMX)
    is given only its fall-through: the loops here have none."""
    index = {ins.addr: k for k, ins in enumerate(func.instructions)}
    succ: list[list[int]] = []
    for k, ins in enumerate(func.instructions):
        conditional = ins.predicate not in (None, "@PT") or "." in ins.mnemonic  # BRA.DIV, ...
        out = []
        if ins.opcode in ("BRA", "JMP") and ins.target is not None:
            if ins.target in index:
                out.append(index[ins.target])
            if conditional and k + 1 < len(func.instructions):
                out.append(k + 1)
        elif ins.opcode in ("EXIT", "RET") and not conditional:
            pass
        elif k + 1 < len(func.instructions):
            out.append(k + 1)
        succ.append(out)
    return succ


def cfg_body(func: Function, loop: Loop) -> list[Instruction]:
    """The loop's instructions by control flow, not by address: those from which a backward
    branch to the header is reached without passing the header (the natural loop). ptxas may lay
    other code (another warp role's, say) inside a loop's address range; it is left out here."""
    succ = _successors(func)
    pred: list[list[int]] = [[] for _ in succ]
    for k, out in enumerate(succ):
        for j in out:
            pred[j].append(k)
    header = next(k for k, ins in enumerate(func.instructions) if ins.addr == loop.start)
    tails = [k for k, ins in enumerate(func.instructions) if ins.target == loop.start and ins.addr > loop.start]
    seen = {header}
    stack = [t for t in tails if t not in seen]
    seen.update(stack)
    while stack:
        for j in pred[stack.pop()]:
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return [func.instructions[k] for k in sorted(seen)]


def own_body(func: Function, loop: Loop, loops: Sequence[Loop]) -> list[Instruction]:
    """The loop's instructions outside every loop nested inside it."""
    inner = [lp for lp in loops if loop.contains(lp)]
    return [i for i in body(func, loop) if not any(lp.start <= i.addr <= lp.end for lp in inner)]


def marker_region(func: Function, marker: str = "PMTRIG") -> tuple[int, int] | None:
    addrs = [i.addr for i in func.instructions if i.opcode == marker]
    return (min(addrs), max(addrs)) if len(addrs) >= 2 else None


@dataclass(frozen=True)
class LoopScore:
    loop: Loop
    tensor: int  # tensor instructions in the whole body
    own_tensor: int  # ... outside nested loops
    own_lop3: int
    size: int
    nested: int  # loops whose address range lies inside this one
    tensor_elems: float | None  # KV elements per thread the body's tensor instructions cover
    unroll: float | None  # tensor_elems / elems_per_iter_per_thread, when whole
    innermost_wgmma: bool = False  # owns warpgroup MMAs, and every tensor instruction of its body

    def key(self) -> tuple:
        return (self.unroll is not None, self.innermost_wgmma, self.own_tensor, self.nested == 0, self.own_lop3,
                -self.size)


def score_loops(func: Function, elems_per_iter_per_thread: float | None = None,
                loops: Sequence[Loop] | None = None) -> list[LoopScore]:
    loops = find_loops(func) if loops is None else loops
    out = []
    for lp in loops:
        ins = body(func, lp)
        own = own_body(func, lp, loops)
        tensor = [i for i in ins if i.info.cls == "tensor"]
        shapes = [tensor_kv_elems_per_thread(i.mnemonic) for i in tensor]
        elems = float(sum(shapes)) if tensor and None not in shapes else None  # type: ignore[arg-type]
        unroll = None
        if elems and elems_per_iter_per_thread:
            ratio = elems / elems_per_iter_per_thread
            unroll = round(ratio) if ratio >= 1 and abs(ratio - round(ratio)) < 1e-6 else None
        inner = [o for o in loops if lp.contains(o)]
        own_tensor = sum(i.info.cls == "tensor" for i in own)
        # Its own warpgroup MMAs and all of its tensor work its own (the address ranges of
        # ptxas's rotated item loops overlap the main loop's without nesting it).
        innermost_wgmma = any(_is_wgmma(i) for i in own) and own_tensor == len(tensor)
        out.append(LoopScore(lp, len(tensor), own_tensor,
                             sum(i.opcode == "LOP3" for i in own), len(ins),
                             len(inner), elems, unroll, innermost_wgmma))
    return out


def _is_wgmma(ins: Instruction) -> bool:
    return ins.info.cls == "tensor" and ins.opcode.endswith("GMMA")  # HGMMA, IGMMA, QGMMA, BGMMA


def candidate_loops(func: Function, elems_per_iter_per_thread: float | None = None, *,
                    marker: bool | str = False) -> list[LoopScore]:
    """Loops the main loop is chosen from, best first (rules in the module docstring)."""
    loops = find_loops(func)
    if marker:
        region = marker_region(func, marker if isinstance(marker, str) else "PMTRIG")
        if region is None:
            raise SassError(
                f"{func.name}: marker={marker!r} asked for, but the kernel has fewer than two "
                "PMTRIG instructions; put asm volatile(\"pmevent 0;\") before and "
                "asm volatile(\"pmevent 1;\") after the main loop."
            )
        loops = [lp for lp in loops if region[0] <= lp.start and lp.end <= region[1]]
    scores = score_loops(func, elems_per_iter_per_thread, loops)
    with_tensor = [sc for sc in scores if sc.tensor > 0]
    if with_tensor:
        return sorted(with_tensor, key=LoopScore.key, reverse=True)
    return sorted(scores, key=lambda sc: sc.size, reverse=True)  # no tensor work: the largest


def main_loop(func: Function, elems_per_iter_per_thread: float | None = None, *,
              marker: bool | str = False) -> Loop | None:
    """The hottest loop (rules in the module docstring), or None for a loop-free kernel."""
    ranked = candidate_loops(func, elems_per_iter_per_thread, marker=marker)
    return ranked[0].loop if ranked else None


# --- KV elements a tensor instruction consumes ---------------------------------------------

# mma.sync shapes as SASS spells them: HMMA.16816 is m16 n8 k16.
_MMA_SHAPES = {"16816": (16, 8, 16), "1688": (16, 8, 8), "16832": (16, 8, 32), "884": (8, 8, 4),
               "8816": (8, 8, 16), "8832": (8, 8, 32), "168256": (16, 8, 256), "1684": (16, 8, 4)}
_MMA_SHAPE = re.compile(r"^[HIBD]MMA\.(\d+)")
_GMMA_SHAPE = re.compile(r"^[HIQB]GMMA\.(\d+)x(\d+)x(\d+)")  # HGMMA.64x8x16


def tensor_kv_elems_per_thread(mnemonic: str) -> float | None:
    """A-operand (M x K) elements one thread's share of a tensor instruction covers,
    assuming KV is the A operand (M side), as in our kernels. None when the shape is unknown."""
    m = _GMMA_SHAPE.match(mnemonic)
    if m:
        mm, _, kk = (int(x) for x in m.groups())
        return mm * kk / 128  # a warpgroup of 128 threads issues one wgmma
    m = _MMA_SHAPE.match(mnemonic)
    if m and m.group(1) in _MMA_SHAPES:
        mm, _, kk = _MMA_SHAPES[m.group(1)]
        return mm * kk / 32
    return None


# --- counting ------------------------------------------------------------------------------


@dataclass
class StaticCounts:
    """Counts and per-element figures of one kernel's loop body (or whole kernel)."""

    kernel: str
    arch: str | None
    scope: str  # 'loop' or 'kernel'
    loop: tuple[int, int] | None
    n_instructions: int
    by_class: dict[str, int]
    by_pipe: dict[str, int]
    by_opcode: dict[str, int]
    elems_per_iter_per_thread: float | None = None
    unroll: float = 1.0
    elems_per_body: float | None = None  # elems_per_iter_per_thread x unroll
    tensor_elems_per_body: float | None = None  # from the tensor instructions' shapes
    per_elem: dict[str, float] = field(default_factory=dict)  # by class, plus 'all'
    half_rate_fma: int = 0
    unknown_opcodes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Local-memory instructions (STL, LDL: ptxas's spills and stack arrays) in the body counted,
    # and in the whole kernel (every role of a warp-specialised kernel, not only the loop's).
    local_in_body: int = 0
    local_in_kernel: int = 0

    @property
    def alu_per_elem(self) -> float | None:
        return self.per_elem.get("alu")

    @property
    def inst_per_elem(self) -> float | None:
        return self.per_elem.get("all")

    def as_dict(self) -> dict:
        return {**asdict(self), "alu_per_elem": self.alu_per_elem, "inst_per_elem": self.inst_per_elem}


LOCAL_OPCODES = ("LDL", "STL")


def count_local(instructions: Iterable[Instruction]) -> int:
    """Local-memory loads and stores among `instructions`."""
    return sum(1 for i in instructions if i.opcode in LOCAL_OPCODES)


def count(instructions: Iterable[Instruction]) -> tuple[dict, dict, dict, int, list[str]]:
    by_class = {c: 0 for c in CLASSES}
    by_pipe: collections.Counter = collections.Counter()
    by_opcode: collections.Counter = collections.Counter()
    half, unknown = 0, set()
    for ins in instructions:
        info = ins.info
        by_class[info.cls] += 1
        by_pipe[info.pipe] += 1
        by_opcode[ins.opcode] += 1
        half += info.half_rate
        if info.pipe == "unknown":
            unknown.add(ins.opcode)
    return by_class, dict(by_pipe), dict(by_opcode.most_common()), half, sorted(unknown)


def analyze_function(
    func: Function,
    elems_per_iter_per_thread: float | None = None,
    *,
    scope: str = "loop",
    tensor_per_iter: float | None = None,
    loop: str | tuple[int, int] = "auto",
    marker: bool | str = False,
) -> StaticCounts:
    notes: list[str] = []
    chosen: Loop | None = None
    all_loops = find_loops(func)
    if scope == "loop":
        if isinstance(loop, tuple):
            chosen = Loop(*loop)
        else:
            ranked = candidate_loops(func, elems_per_iter_per_thread, marker=marker)
            chosen = ranked[0].loop if ranked else None
            if chosen is None:
                notes.append("no loop found: counted the whole kernel")
            else:
                notes += _selection_notes(ranked, elems_per_iter_per_thread)
        if chosen is not None:
            nested = [lp for lp in all_loops if chosen.contains(lp)]
            if nested:
                notes.append(
                    "the loop holds inner loop(s) "
                    + ", ".join(f"{lp.start:#x}-{lp.end:#x}" for lp in nested)
                    + ", counted once per trip although they may run more often: trust the "
                    "dynamic figure here"
                )
    ins = body(func, chosen)
    by_class, by_pipe, by_opcode, half, unknown = count(ins)
    res = StaticCounts(
        kernel=func.name, arch=func.arch, scope="loop" if chosen else "kernel",
        loop=(chosen.start, chosen.end) if chosen else None, n_instructions=len(ins),
        by_class=by_class, by_pipe=by_pipe, by_opcode=by_opcode, half_rate_fma=half,
        unknown_opcodes=unknown, notes=notes,
        local_in_body=count_local(ins), local_in_kernel=count_local(func.instructions),
    )
    if unknown:
        notes.append(f"opcodes not in suite/alu/isa.py, counted as 'other': {', '.join(unknown)}")
    shapes = [tensor_kv_elems_per_thread(i.mnemonic) for i in ins if i.info.cls == "tensor"]
    if shapes and all(s is not None for s in shapes):
        res.tensor_elems_per_body = float(sum(shapes))  # type: ignore[arg-type]
    if chosen is None or not elems_per_iter_per_thread:
        return res
    n_tensor = by_class["tensor"]
    res.elems_per_iter_per_thread = float(elems_per_iter_per_thread)
    if tensor_per_iter:
        res.unroll = n_tensor / tensor_per_iter
        if n_tensor % tensor_per_iter:
            notes.append(
                f"{n_tensor} tensor instructions in the body is not a multiple of "
                f"tensor_per_iter={tensor_per_iter}: the loop found may not be the main loop"
            )
    elif res.tensor_elems_per_body:
        ratio = res.tensor_elems_per_body / res.elems_per_iter_per_thread
        if ratio >= 1 and abs(ratio - round(ratio)) < 1e-6:
            res.unroll = float(round(ratio))  # ptxas unrolled (or the source loop did) k trips
    res.elems_per_body = res.elems_per_iter_per_thread * res.unroll
    if res.tensor_elems_per_body and abs(res.tensor_elems_per_body / res.elems_per_body - 1) > 0.01:
        notes.append(
            f"the body's tensor instructions cover {res.tensor_elems_per_body:g} KV elements per "
            f"thread (KV as the A operand), the metadata says {res.elems_per_body:g}: the "
            "per-element figures assume the metadata; check the loop chosen"
        )
    res.per_elem = {c: n / res.elems_per_body for c, n in by_class.items()}
    res.per_elem["all"] = len(ins) / res.elems_per_body
    return res


def _selection_notes(ranked: Sequence[LoopScore], elems: float | None) -> list[str]:
    best, notes = ranked[0], []
    if elems and best.tensor and best.unroll is None:
        notes.append(
            f"no loop's tensor instructions cover a whole multiple of {elems:g} KV elements "
            "per thread; picked the one with the most tensor work of its own"
        )
    rivals = [sc for sc in ranked[1:] if sc.tensor and sc.key()[:2] == best.key()[:2]]
    if rivals:
        notes.append(
            f"picked loop {best.loop.start:#x}-{best.loop.end:#x} ({best.own_lop3} LOP3) over "
            + ", ".join(f"{sc.loop.start:#x}-{sc.loop.end:#x} ({sc.own_lop3} LOP3)" for sc in rivals[:4])
            + " with as much tensor work; PMTRIG markers or loop=(start, end) choose exactly"
        )
    return notes


def select_functions(funcs: Sequence[Function], kernel_regex: str | None) -> list[Function]:
    if not kernel_regex:
        return list(funcs)
    pat = re.compile(kernel_regex)
    return [f for f in funcs if pat.search(f.name)]


def static_alu(
    binary: str | os.PathLike,
    kernel_regex: str | None = None,
    elems_per_iter_per_thread: float | None = None,
    *,
    scope: str = "loop",
    tensor_per_iter: float | None = None,
    loop: str | tuple[int, int] = "auto",
    marker: bool | str = False,
    arch: str | None = None,
    sass_text: str | None = None,
) -> list[StaticCounts]:
    """Per-class counts and per-element figures for every kernel whose (mangled) name
    matches `kernel_regex` (re.search). `scope='kernel'` counts whole kernels. Pass
    `sass_text` to analyse a listing instead of running cuobjdump."""
    text = sass_text if sass_text is not None else disassemble(binary, arch)
    funcs = parse_sass(text)
    if arch:
        funcs = [f for f in funcs if f.arch in (None, arch)]
    chosen = select_functions(funcs, kernel_regex)
    if not chosen:
        names = ", ".join(sorted({f.name for f in funcs})[:20]) or "none"
        raise SassError(f"no kernel matches {kernel_regex!r}; the binary holds: {names}.")
    return [
        analyze_function(
            f, elems_per_iter_per_thread, scope=scope, tensor_per_iter=tensor_per_iter,
            loop=loop, marker=marker,
        )
        for f in chosen
    ]
