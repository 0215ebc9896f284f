"""The measured read ceiling: the best streaming-read bandwidth a kernel reaches on this GPU,
searched over several read kernels and launch shapes, the best few re-timed in interleaved
rounds; recorded with its spread, beside the bus-derived and datasheet peaks.

It is an attainable figure (the bus-derived peak is the bound no kernel passes), so it only
holds if the search finds the GPU's best: enough bytes in flight per SM (many 16-byte
loads issued before any is consumed), grids from one wave of persistent programs to many
short-lived ones, with and without L1 bypass; torch's own reduction as a check. A decode
kernel that beats it by more than both spreads says the search missed something: the
report lists such records (reports.gpu.above_ceiling).

`foscar-bench ceiling` runs it alone; the sweep runs it once per GPU. The search and its
summary are pure logic (`search`, `summarize`), tested on the CPU with a fake timer.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

MAX_BUFFER_BYTES = 8 << 30  # long enough (~1.8 ms at 4.8 TB/s) that launch and tail fade
FINALISTS = 4
ROUNDS = 3
MAX_INT32_PER_LANE = 64  # 16 16-byte loads in flight per lane; more spills registers


@dataclass(frozen=True)
class Candidate:
    """One read kernel at one launch shape; `kind` says which builder makes it."""

    kind: str  # "persistent", "tiled", "torch-sum"
    params: tuple = ()  # ((name, value), ...) so a candidate is hashable and printable

    @property
    def name(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.kind}({args})" if args else self.kind

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


@dataclass
class Result:
    """A candidate's timings: one (median_us, spread) per round it was timed in."""

    candidate: Candidate
    bytes_read: int
    rounds: list[tuple[float, float]] = field(default_factory=list)

    def tbps(self) -> list[float]:
        return [self.bytes_read / (med * 1e-6) / 1e12 for med, _ in self.rounds if med > 0]

    @property
    def median_tbps(self) -> float:
        t = self.tbps()
        return statistics.median(t) if t else float("nan")

    @property
    def median_us(self) -> float:
        """The median over rounds of each round's median time."""
        t = [med for med, _ in self.rounds if med > 0]
        return statistics.median(t) if t else float("nan")

    @property
    def spread(self) -> float:
        """Relative width of what we know of this candidate's bandwidth: the range over
        rounds, or the widest within-round 95% interval of the median, whichever is wider."""
        t = self.tbps()
        if not t:
            return float("nan")
        across = (max(t) - min(t)) / statistics.median(t) if len(t) > 1 else 0.0
        within = max((s for _, s in self.rounds if s == s), default=0.0)
        return max(across, within)


def candidates(sm_count: int, quick: bool = False) -> list[Candidate]:
    """The search space. Persistent: a grid of k x SMs programs looping over the buffer,
    each step one load of TILE int32 per program (TILE / (32 x warps) / 4 16-byte loads per
    lane in flight); tiled: one program per TILE, as many programs as tiles."""
    out: list[Candidate] = []
    per_sm = (2, 8) if quick else (1, 2, 4, 8, 16)
    tiles = (8192,) if quick else (4096, 8192, 16384)
    shapes = [(tile, warps) for tile in tiles for warps in (4, 8) if tile // (32 * warps) <= MAX_INT32_PER_LANE]
    for k in per_sm:
        for tile, warps in shapes:
            for cache in ((".cg",) if quick else ("default", ".cg")):
                out.append(Candidate("persistent", (("programs", k * sm_count), ("tile", tile),
                                                    ("warps", warps), ("cache", cache))))
    for tile, warps in shapes:
        out.append(Candidate("tiled", (("tile", tile), ("warps", warps))))
    out.append(Candidate("torch-sum", (("dtype", "int32"),)))
    return out


def by_bandwidth(r: Result) -> float:
    return -r.median_tbps


def by_time(r: Result) -> float:
    return r.median_us


def search(cands: Sequence[Candidate], bytes_read: Callable[[Candidate], int],
           time_one: Callable[[Candidate, bool], tuple[float, float]],
           finalists: int = FINALISTS, rounds: int = ROUNDS,
           rank: Callable[[Result], float] = by_bandwidth) -> list[Result]:
    """Screen every candidate once (time_one(c, final=False) -> (median_us, spread); a
    candidate that fails raises and is dropped), then time the best `finalists` again in
    `rounds` interleaved rounds (final=True), so drift touches them all alike. Returns every
    result, best first: highest bandwidth by default, or by `rank` (smallest first; the
    read floor ranks by time, suite.readfloor)."""
    results = []
    for c in cands:
        try:
            med, spread = time_one(c, False)
        except Exception:  # noqa: BLE001 - a config that does not build is no candidate
            continue
        results.append(Result(c, bytes_read(c), [(med, spread)]))
    results.sort(key=rank)
    best, rest = results[:finalists], results[finalists:]
    for r in best:
        r.rounds = []
    for _ in range(rounds):
        for r in best:
            r.rounds.append(time_one(r.candidate, True))
    best.sort(key=rank)
    return best + rest


def summarize(results: Sequence[Result], method_note: str = "") -> dict[str, Any]:
    """The record of a search: the best finalist's bandwidth (median over rounds) as the
    ceiling, its spread, and every candidate's figure."""
    if not results:
        return {"read_ceiling_tbps": None, "method": "no read kernel ran" + (f": {method_note}" if method_note else "")}
    best = results[0]
    return {
        "read_ceiling_tbps": best.median_tbps,
        "spread": best.spread,
        "method": f"best of {len(results)} read kernels and launch shapes: {best.candidate.name}",
        "bytes": best.bytes_read,
        "median_us": statistics.median(med for med, _ in best.rounds),
        "rounds": len(best.rounds),
        "candidates": [
            {"name": r.candidate.name, "tbps": r.median_tbps, "spread": r.spread, "rounds": len(r.rounds)}
            for r in results
        ],
    }


# --- GPU ------------------------------------------------------------------------------------
def triton_kernels():
    """The two Triton read kernels (persistent, tiled), compiled on first launch."""
    import triton
    import triton.language as tl

    @triton.jit
    def persistent_read(x_ptr, out_ptr, n_tiles, TILE: tl.constexpr, CACHE: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        offs = tl.max_contiguous(tl.multiple_of(tl.arange(0, TILE), TILE), TILE)
        acc = tl.zeros([TILE], dtype=tl.int32)
        for t in range(pid, n_tiles, nprog):
            acc ^= tl.load(x_ptr + t.to(tl.int64) * TILE + offs, cache_modifier=CACHE)
        tl.store(out_ptr + pid, tl.xor_sum(acc, axis=0))

    @triton.jit
    def tiled_read(x_ptr, out_ptr, TILE: tl.constexpr):
        pid = tl.program_id(0)
        offs = tl.max_contiguous(tl.multiple_of(tl.arange(0, TILE), TILE), TILE)
        v = tl.load(x_ptr + pid.to(tl.int64) * TILE + offs, cache_modifier=".cg")
        tl.store(out_ptr + pid, tl.xor_sum(v, axis=0))

    return persistent_read, tiled_read


def _builder(x, n_int32: int):
    """candidate -> thunk that reads the buffer once."""
    import torch

    kernels = None

    def build(c: Candidate) -> Callable[[], Any]:
        nonlocal kernels
        if c.kind == "torch-sum":
            return lambda: torch.sum(x)
        if kernels is None:
            kernels = triton_kernels()
        persistent, tiled = kernels
        tile = c.get("tile")
        n_tiles = n_int32 // tile
        if c.kind == "persistent":
            grid = min(c.get("programs"), n_tiles)
            out = torch.empty(grid, dtype=torch.int32, device=x.device)
            cache = "" if c.get("cache") == "default" else c.get("cache")
            return lambda: persistent[(grid,)](x, out, n_tiles, TILE=tile, CACHE=cache, num_warps=c.get("warps"))
        out = torch.empty(n_tiles, dtype=torch.int32, device=x.device)
        return lambda: tiled[(n_tiles,)](x, out, TILE=tile, num_warps=c.get("warps"))

    return build


def buffer_bytes(total_memory: int) -> int:
    return int(min(MAX_BUFFER_BYTES, total_memory // 16)) // (1 << 20) * (1 << 20)


def measure_read_ceiling(device: Any, nbytes: int | None = None, quick: bool = False,
                         rounds: int = ROUNDS, finalists: int = FINALISTS) -> dict[str, Any]:
    """Search the read kernels on `device`; returns summarize()'s dict ('read_ceiling_tbps',
    'spread', 'method', 'bytes', 'median_us', 'candidates', ...)."""
    import torch

    from suite.timing import StopRule, time_gpu

    props = torch.cuda.get_device_properties(device)
    nbytes = nbytes or buffer_bytes(props.total_memory)
    n = nbytes // 4 // 65536 * 65536  # whole tiles for every tile size searched
    x = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device=device)
    build = _builder(x, n)
    screen = StopRule(target_spread=0.02, min_samples=5, min_time_s=0.0, max_time_s=0.3)
    final = StopRule(target_spread=0.005, min_samples=15, min_time_s=0.05, max_time_s=2.0)
    thunks: dict[Candidate, Callable[[], Any]] = {}

    def time_one(c: Candidate, is_final: bool) -> tuple[float, float]:
        if c not in thunks:
            thunks[c] = build(c)
            thunks[c]()  # compile (Triton) outside the timing; a failure drops the candidate
            torch.cuda.synchronize(device)
        t, _ = time_gpu([thunks[c]], l2_policy="size", use_graphs=False, rule=final if is_final else screen)
        return t.median_us, t.spread

    with torch.cuda.device(device):
        results = search(candidates(props.multi_processor_count, quick), lambda c: n * 4, time_one,
                         finalists=finalists, rounds=rounds)
    out = summarize(results)
    out["buffer_bytes"] = n * 4
    del x, thunks
    torch.cuda.empty_cache()
    return out


def table(summary: dict[str, Any], limit: int = 12) -> list[str]:
    """Lines for a terminal: the ceiling, then the candidates best first."""
    if summary.get("read_ceiling_tbps") is None:
        return [f"read ceiling: not measured ({summary.get('method')})"]
    lines = [f"read ceiling {summary['read_ceiling_tbps']:.3f} TB/s (spread {100 * summary['spread']:.2f}%, "
             f"{summary['rounds']} rounds over {summary['bytes'] / 2**30:.1f} GiB): {summary['method']}"]
    for c in summary["candidates"][:limit]:
        lines.append(f"  {c['tbps']:.3f} TB/s  ±{100 * c['spread'] / 2:.2f}%  x{c['rounds']}  {c['name']}")
    return lines
