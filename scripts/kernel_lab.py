"""Kernel experiments: build several variants of libfoscar (kernel knobs as -D flags), then
measure each through the harness's own path, the one `foscar-bench sweep` takes.

  PYTHONPATH=. python scripts/kernel_lab.py \
      --variant v7= --variant c2=FOSCAR_CTAS_INT4=2 --variant s6=FOSCAR_STAGES_INT4=6 \
      --configs 4ct,2ct --json $OUT/lab.json

A variant is NAME=KNOB[,KNOB...] where each KNOB is FOSCAR_NAME=VALUE (foscar_decode.cuh).
A config is bits + K mode + V mode (t token, c channel), `d` at the end for the dequantize
ablation: 4ct, 2ct, 4tcd.

Each (config, variant) is one harness measurement (suite.runner.measure of a
baselines.foscar.FoscarVariant): the float64 check with the suite's tolerance, then cold-L2
timing (CUDA-graph replays, copies rotated or L2 flushed when the cache is small), p10/p90
interpolated, bytes from core.bytes_model. So "passed", p10 and TB/s mean here what they
mean in the sweep and in docs/PERFORMANCE.md. A variant that fails the check is not timed.
`--rounds N` lets the variants take turns N times (clock drift then hits all alike).
`--splits 8,16,32` times each variant with those split counts forced (NAME/s8, ...) instead of
the launch plan's; `plan` in the list adds the plan's own launch beside them (`--splits plan,16,32`).
`--instances planner,own` times each variant as the planner launches it (NAME) and with every
kernel kept to its own instance (NAME/own: what a library without second instances, such as
v31's, runs), so that one library answers whether its second instances pay.

`--prebuilt NAME=PATH` adds a library built elsewhere (another commit's libfoscar.so, its
cache directory carried to the box) as a variant, so that one call compares two trees' kernels;
its C struct must be a prefix of this tree's (fields are only ever appended). With --prebuilt
and no --variant nothing is built.

`--profile NAME` runs one launch of that variant per config, after the same check, inside
the NVTX range `lab_<config>` for `ncu --nvtx --nvtx-include 'lab_4ct/'`, and skips timing.

`--timeline NAME` builds that variant with FOSCAR_TIMELINE=1 (or takes that --prebuilt library,
built with the knob where it was built) and, per config after the same
check, runs one launch with L2 warm (after a warm-up) and one with L2 cold (after a write of
4x L2), each recording each CTA's phases (%globaltimer, foscar_decode.cuh): a row per
(CTA, item) of phase offsets in us from the earliest CTA entry, and per phase the median and
max over CTAs, with the merging CTAs' merge times (merged - written). tick_ns is the smallest
step between two stamps: the clock's resolution at best.
Untimed; the table goes to --json, or is printed.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

MODES = {"t": "token", "c": "channel"}
ARCH = "sm_90a"


def parse_splits(spec: str | None) -> list[int | None]:
    """--splits "plan,16,32" -> [None, 16, 32]: None is the planner's own launch."""
    if not spec:
        return [None]
    try:
        splits = [None if n.strip() == "plan" else int(n) for n in spec.split(",")]
    except ValueError:
        raise SystemExit(f"--splits {spec!r}: expected a comma list of integers or 'plan', e.g. plan,8,16,32") from None
    if any(n is not None and n < 1 for n in splits):
        raise SystemExit(f"--splits {spec!r}: split counts must be >= 1")
    if len(set(splits)) < len(splits):  # two rows of one label
        raise SystemExit(f"--splits {spec!r}: a split count twice")
    return splits


def parse_prebuilt(specs: list[str]) -> dict[str, str]:
    """--prebuilt NAME=PATH entries -> {name: path of the library}."""
    out = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        if not name or not path:
            raise SystemExit(f"--prebuilt {spec!r}: expected NAME=PATH of a libfoscar.so")
        out[name] = path
    return out


def parse_variant(spec: str) -> tuple[str, tuple[str, ...]]:
    name, _, knobs = spec.partition("=")
    if not name:
        raise SystemExit(f"--variant {spec!r}: expected NAME=KNOB[,KNOB...] (knobs may be empty)")
    return name, tuple(f"-D{k}" for k in knobs.split(",") if k)


def parse_config(spec: str) -> tuple[int, str, str, str]:
    """'4ct' -> (bits, k_mode, v_mode, kernel variant); a trailing 'd' is the dequant ablation."""
    if (len(spec) not in (3, 4) or spec[0] not in "24" or spec[1] not in MODES or spec[2] not in MODES
            or spec[3:] not in ("", "d")):  # "4ct2ct" (a comma missed) is no 4ct
        raise SystemExit(f"--configs entry {spec!r}: expected bits + K mode + V mode, e.g. 4ct")
    return int(spec[0]), MODES[spec[1]], MODES[spec[2]], "dequant" if spec.endswith("d") else "fold"


def unique_names(variants: list, prebuilt: dict[str, str]) -> None:
    """Each --variant and --prebuilt name once: a second one of a name would replace the first's
    library while both kept their labels, so rows would name a build they did not measure."""
    names = [n for n, _ in variants] + list(prebuilt)
    if dups := sorted({n for n in names if names.count(n) > 1}):
        raise SystemExit(f"--variant/--prebuilt names used twice: {', '.join(dups)}")


def turns(backends: list, round_: int) -> list:
    """The order of round round_: each round starts one later, so that over the rounds no
    variant is always the first measured (after the builds, the check's warm-up) or the last."""
    k = round_ % len(backends) if backends else 0
    return backends[k:] + backends[:k]


def make_case(args: argparse.Namespace, spec: str):
    from core.case import MODELS, Case

    bits, k_mode, v_mode, _ = parse_config(spec)
    shape = (args.q_heads, args.kv_heads, 128)
    model = next((name for name, heads in MODELS.items() if heads == shape), "custom")
    return Case(batch=args.batch, kv_len=args.kv_len, num_q_heads=args.q_heads, num_kv_heads=args.kv_heads,
                head_dim=128, bits=bits, k_mode=k_mode, v_mode=v_mode, group_size=args.group,
                page_size=args.page, model=model)


def ctas(lib, bits: int) -> str:
    return "/".join(str(lib.foscar_ctas_per_sm(bits, 128, 1, 0, 0, hp)) for hp in (1, 2))


def profiled(variants: list, prebuilt: dict[str, str], name: str, option: str = "--profile") -> tuple[list, dict[str, str]]:
    """--profile NAME: the one build or prebuilt library of that name, the others dropped."""
    variants = [v for v in variants if v[0] == name]
    prebuilt = {n: path for n, path in prebuilt.items() if n == name}
    if not variants and not prebuilt:
        raise SystemExit(f"{option} {name!r} names no --variant and no --prebuilt")
    return variants, prebuilt


def timelined(variants: list, prebuilt: dict[str, str], name: str) -> tuple[list, dict[str, str]]:
    """--timeline NAME: as profiled, the build given FOSCAR_TIMELINE=1; a prebuilt library runs as
    it is (built with the knob elsewhere: one without it refuses the launch, by name)."""
    variants, prebuilt = profiled(variants, prebuilt, name, "--timeline")
    return [(n, d if TIMELINE_KNOB in d else (*d, TIMELINE_KNOB)) for n, d in variants], prebuilt


def build_variants(variants: list[tuple[str, tuple[str, ...]]]) -> dict:
    """name -> loaded library, each build's registers and spills printed."""
    from foscar import kernels
    from foscar.build import build

    if not variants:  # only prebuilt libraries (--profile of one)
        return {}
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=len(variants)) as pool:  # builds in parallel, then loads from the cache
        builds = list(pool.map(lambda v: build(ARCH, defines=v[1]), variants))
    libs = {name: kernels.load_library(ARCH, defines) for name, defines in variants}
    for (name, defines), res in zip(variants, builds):
        hot = [r for r in res.resources if "decode_kernel" in r.name]
        regs = sorted({r.registers for r in hot})
        spills = sum(r.spill_store_bytes + r.spill_load_bytes for r in hot)
        print(f"built {name} {' '.join(defines) or '(defaults)'}: registers {regs}, spill bytes {spills}, "
              f"CTAs/SM (G = 128, K channel, V token, one head / paired) int4 {ctas(libs[name], 4)} "
              f"int2 {ctas(libs[name], 2)}",
              flush=True)
    print(f"builds: {time.time() - t0:.0f} s", flush=True)
    return libs


def checked(case, backend, ctx, spec: str, skipped: str):
    """(source, prepared) after the harness's check, or None (said, with `skipped`) when wrong."""
    from suite.runner import check, source_for

    source = source_for(ctx, case)
    prepared = backend.prepare(case, source)
    _, wrong = check(case, backend, prepared, source, ctx)
    if wrong:
        print(f"{spec} {backend.name}: WRONG, {wrong} {skipped}", flush=True)
        return None
    return source, prepared


def profile(case, backend, ctx, spec: str) -> None:
    """The harness's check, then one launch inside the NVTX range ncu filters on."""
    import torch

    if (ok := checked(case, backend, ctx, spec, "not profiled")) is None:
        return
    _, prepared = ok
    prepared.run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(f"lab_{spec}")
    prepared.run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"profiled {spec} {backend.name}", flush=True)


TIMELINE_KNOB = "-DFOSCAR_TIMELINE=1"


def timeline_table(stamps: list) -> dict:
    """The per-CTA table and summary of one launch's stamps ([cta][k][phase], ns, 0 not
    reached): offsets in us from the earliest CTA entry."""
    from foscar.kernels import TIMELINE_PHASES

    entry, written, merged = (TIMELINE_PHASES.index(n) for n in ("entry", "written", "merged"))
    t0 = min(items[0][entry] for items in stamps if items[0][entry])
    grid = sum(1 for items in stamps if items[0][entry])  # the CTAs launched (the first ones)

    def us(t):
        return round((t - t0) / 1000, 3) if t else None

    rows, per_phase, merges = [], [[] for _ in TIMELINE_PHASES], []
    for cta, items in enumerate(stamps):
        for k, row in enumerate(items):
            if not any(row):
                continue
            rows.append([cta, k, cta + k * grid, *map(us, row)])
            for phase, t in enumerate(row):
                if t:
                    per_phase[phase].append(us(t))
            if row[merged]:
                merges.append([cta, round((row[merged] - row[written]) / 1000, 3)])
    ticks = sorted({t for items in stamps for row in items for t in row if t})
    summary = {name: {"n": len(v), "median_us": round(statistics.median(v), 3), "max_us": max(v)}
               for name, v in zip(TIMELINE_PHASES, per_phase) if v}
    merge_us = [m[1] for m in merges]
    return {"grid": grid, "tick_ns": min((b - a for a, b in zip(ticks, ticks[1:])), default=None),
            "columns": ["cta", "k", "item", *(f"{n}_us" for n in TIMELINE_PHASES)], "ctas": rows,
            "summary": summary,
            "merges": {"n": len(merges), "median_us": round(statistics.median(merge_us), 3) if merges else None,
                       "max_us": max(merge_us, default=None), "each": merges}}


def timeline(case, backend, ctx, spec: str) -> dict | None:
    """The harness's check, then per L2 state one launch recording the timeline: "warm", the
    launch after a warm-up; "cold", the same after a write of 4x L2 evicts it (whose dirty
    lines may still be written back while the launch starts); "rotated", the launch on a copy
    of the cache right after launches on other copies that hold 4x L2 between them, as the
    harness keeps L2 cold (suite.runner.measure)."""
    import torch

    from foscar import kernels
    from foscar.cache import QuantizedKVCache

    if (ok := checked(case, backend, ctx, spec, "no timeline")) is None:
        return None
    source, prepared = ok
    cache = prepared.keepalive[0]  # the backend's own cache (baselines/foscar.py)
    if not isinstance(cache, QuantizedKVCache):
        raise SystemExit(f"{backend.name}: its prepared step keeps no foscar cache first; see baselines/foscar.py")
    launch = dict(variant=backend.variant, num_splits=backend.num_splits, library=backend.library,
                  kv_heads_per_item=backend.kv_heads_per_item, second_instance=backend.second_instance)
    plan = kernels.decode_plan(source.q, cache, **launch)
    stamps = torch.zeros(kernels.timeline_entries(plan.num_ctas), dtype=torch.int64, device=source.q.device)
    l2 = torch.cuda.get_device_properties(source.q.device).L2_cache_size
    shape = (plan.num_ctas, kernels.TIMELINE_ITEMS, len(kernels.TIMELINE_PHASES))
    out = {"config": spec, "variant": backend.name, "num_splits": plan.num_splits,
           "chunks_per_split": plan.chunks_per_split, "num_ctas": plan.num_ctas}
    kernels.decode(source.q, cache, sm_scale=source.sm_scale, out=prepared.out, timeline=stamps, **launch)  # warm-up
    copies = rotation_copies(cache, 4 * l2)
    others = torch.zeros_like(stamps)  # the other copies' stamps, not read
    for state in ("warm", "cold", "rotated"):
        if state == "cold":
            torch.empty(4 * l2, dtype=torch.uint8, device=source.q.device).fill_(1)  # evicts the cache's lines
        if state == "rotated":
            for copy in copies:
                kernels.decode(source.q, copy, sm_scale=source.sm_scale, out=prepared.out, timeline=others, **launch)
        stamps.zero_()
        kernels.decode(source.q, cache, sm_scale=source.sm_scale, out=prepared.out, timeline=stamps, **launch)
        torch.cuda.synchronize()
        table = timeline_table(stamps.view(shape).tolist())
        if state == "warm":
            out.update(table)  # the warm launch at the top level, as before
        else:
            out[state] = table
    out["rotated_copies"] = len(copies)
    return out


def rotation_copies(cache, reuse_bytes: int, most: int = 256) -> list:
    """Copies of the cache (codes, parameters, tails; the page table and lengths shared) whose
    bytes together reach reuse_bytes: launched one after another before a launch on the
    original, they leave none of its lines in an L2 of reuse_bytes / 4 or less."""
    import dataclasses

    each = sum(t.numel() * t.element_size() for t in (cache.k_codes, cache.v_codes, cache.k_params,
                                                       cache.v_params, cache.k_tail, cache.v_tail))
    n = min(most, max(1, -(-reuse_bytes // max(each, 1))))
    return [dataclasses.replace(cache, k_codes=cache.k_codes.clone(), v_codes=cache.v_codes.clone(),
                                k_params=cache.k_params.clone(), v_params=cache.v_params.clone(),
                                k_tail=cache.k_tail.clone(), v_tail=cache.v_tail.clone(), free_pages=[])
            for _ in range(n)]


def print_timeline(t: dict, rows: bool) -> None:
    print(f"\n{t['config']} {t['variant']}: {t['grid']} CTAs, {t['num_splits']} splits of {t['chunks_per_split']} "
          f"chunks, tick {t['tick_ns']} ns")
    if rows:
        print("".join(f"{c:>11}" for c in t["columns"]))
        for r in t["ctas"]:
            print("".join(f"{'-' if v is None else v:>11}" for v in r))
    print(f"{'phase':<12}{'n':>6}{'median us':>11}{'max us':>9}")
    for name, v in t["summary"].items():
        print(f"{name:<12}{v['n']:>6}{v['median_us']:>11.3f}{v['max_us']:>9.3f}")
    m = t["merges"]
    if m["n"]:
        print(f"merges: {m['n']}, median {m['median_us']:.3f} us, max {m['max_us']:.3f} us; (cta, us) {m['each']}")
    for state, title in (("cold", "L2 cold (4x L2 written just before):"),
                         ("rotated", f"L2 cold (after launches on {t.get('rotated_copies')} other copies):")):
        if state in t:
            print(title)
            print_timeline({**t[state], "config": t["config"], "variant": t["variant"], "num_splits": t["num_splits"],
                            "chunks_per_split": t["chunks_per_split"]}, rows)


def lab_row(spec: str, name: str, round_: int, record) -> dict:
    flat = record.flat()
    flat.pop("traceback", None)
    return {"config": spec, "variant": name, "round": round_, **flat}


def print_table(rows: list[dict]) -> None:
    def num(row, key, fmt, scale=1.0):
        value = row.get(key)
        return format(value * scale, fmt) if isinstance(value, (int, float)) and not math.isnan(value) else "-"

    print(f"\n{'config':<7}{'variant':<12}{'status':<12}{'us':>9}{'p10':>9}{'p90':>9}{'TB/s':>7}{'%peak':>7}{'err':>10}")
    for r in rows:
        print(f"{r['config']:<7}{r['variant']:<12}{r['status']:<12}{num(r, 'median_us', '9.1f')}"
              f"{num(r, 'p10_us', '9.1f')}{num(r, 'p90_us', '9.1f')}{num(r, 'eff_bandwidth_tbps', '7.2f')}"
              f"{num(r, 'frac_peak_datasheet', '7.1f', 100)}{num(r, 'rel_error', '10.2e')}")


def parse_heads(text: str | None) -> list[int | None]:
    """--heads-per-item: None (the planner's), or a comma list of 1 and 2."""
    if not text:
        return [None]
    try:
        heads = [int(n) for n in text.split(",")]
    except ValueError:
        raise SystemExit(f"--heads-per-item {text!r}: expected a comma list of 1 and 2, e.g. 1,2") from None
    if any(h not in (1, 2) for h in heads):
        raise SystemExit(f"--heads-per-item {text!r}: an item holds 1 or 2 KV heads")
    return heads


INSTANCES = {"planner": True, "own": False}  # --instances: decode()'s second_instance


def parse_instances(text: str) -> list[bool]:
    """--instances: a comma list of planner (the planner's choice) and own (the kernel's own)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in INSTANCES for n in names):
        raise SystemExit(f"--instances {text!r}: expected a comma list of {' and '.join(INSTANCES)}, e.g. planner,own")
    return [INSTANCES[n] for n in names]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=[], help="NAME=KNOB[,KNOB...]")
    ap.add_argument("--configs", default="4ct,2ct")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--kv-len", type=int, default=32768)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--page", type=int, default=128)
    ap.add_argument("--splits", default=None,
                    help="comma list of split counts to force (each a variant of its own, NAME/sN), 'plan' for the "
                         "planner's own launch among them; default: the plan's")
    ap.add_argument("--instances", default="planner",
                    help="planner (the planner's choice of a kernel's instance), own (its own instance only, "
                         "NAME/own), or both: planner,own")
    ap.add_argument("--heads-per-item", default=None,
                    help="comma list of KV heads per item to force (1, 2), each a variant of its own, NAME/h1, "
                         "NAME/h2; default: the planner's")
    ap.add_argument("--max-item-chunks", type=int, default=None,
                    help="lift the planner's longest split (foscar.kernels.MAX_ITEM_CHUNKS, both widths) so that "
                         "--splits may force longer ones, to measure what the limit guards")
    ap.add_argument("--prebuilt", action="append", default=[],
                    help="NAME=PATH: another tree's libfoscar.so, measured as a variant beside the builds")
    ap.add_argument("--rounds", type=int, default=1, help="times the variants take turns (each a full measurement)")
    ap.add_argument("--profile", default=None, help="variant to run once per config for ncu")
    ap.add_argument("--timeline", default=None,
                    help="variant to build with FOSCAR_TIMELINE=1 (or --prebuilt library built with it) and run once "
                         "per config, recording each CTA's phases")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    # No --variant: the tree's default build, unless only --prebuilt libraries are compared (then
    # nothing is built: a box given two carried libraries spends no time in nvcc).
    variants = [parse_variant(v) for v in (args.variant or ([] if args.prebuilt else ["base="]))]
    if args.profile and args.timeline:
        raise SystemExit("--profile and --timeline each run one variant their own way: pass one")
    prebuilt = parse_prebuilt(args.prebuilt)
    unique_names(variants, prebuilt)
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: at least 1")
    if args.profile:
        variants, prebuilt = profiled(variants, prebuilt, args.profile)
    if args.timeline:
        variants, prebuilt = timelined(variants, prebuilt, args.timeline)
    specs = [c.strip() for c in args.configs.split(",") if c.strip()]
    splits = parse_splits(args.splits)
    heads = parse_heads(args.heads_per_item)
    instances = parse_instances(args.instances)
    cases = {spec: make_case(args, spec) for spec in specs}  # a bad config fails before any build

    from baselines.foscar import FoscarVariant
    from suite.runner import measure
    from suite.worker import make_context

    if args.max_item_chunks is not None:  # 0 was dropped silently
        if args.max_item_chunks < 1:
            raise SystemExit(f"--max-item-chunks {args.max_item_chunks}: at least 1")
        from foscar import kernels
        kernels.MAX_ITEM_CHUNKS = {bits: args.max_item_chunks for bits in kernels.MAX_ITEM_CHUNKS}
    libs = build_variants(variants)
    if prebuilt:
        from foscar import kernels
        for name, path in prebuilt.items():
            libs[name] = kernels.bind(ctypes.CDLL(path), "foscar")
            variants.append((name, (f"prebuilt:{path}",)))  # its label in the rows and the JSON
    ctx = make_context("0", {"read_ceiling": False})
    rows, timelines = [], []
    for spec in specs:
        case = cases[spec]
        kernel_variant = parse_config(spec)[3]
        backends = [FoscarVariant(name + ("" if n is None else f"/s{n}") + ("" if h is None else f"/h{h}")
                                  + ("" if second else "/own"),
                                  case.bits, libs[name], variant=kernel_variant, defines=defines, num_splits=n,
                                  kv_heads_per_item=h, second_instance=second)
                    for name, defines in variants for n in splits for h in heads for second in instances]
        if args.profile:
            for backend in backends:
                profile(case, backend, ctx, spec)
            continue
        if args.timeline:
            for backend in backends:
                if (t := timeline(case, backend, ctx, spec)) is not None:
                    timelines.append(t)
                    print_timeline(t, rows=not args.json)
            continue
        for round_ in range(args.rounds):
            for backend in turns(backends, round_):
                record, fatal = measure(case, backend, ctx)
                rows.append(lab_row(spec, backend.name, round_, record))
                print(json.dumps(rows[-1], default=str), flush=True)
                if record.status != "passed":
                    print(f"{spec} {backend.name}: {record.status.upper()}: {record.reason}", flush=True)
                if fatal:
                    raise SystemExit(f"{spec} {backend.name} left the CUDA context unusable; stopping.")
    if not (args.profile or args.timeline):
        print_table(rows)
    if args.json and args.timeline:
        with open(args.json, "w") as f:  # unindented: a launch has hundreds of CTA rows
            json.dump({"variants": {n: list(d) for n, d in variants}, "timelines": timelines}, f)
    elif args.json:
        peak = ctx.gpu_env.get("datasheet_peak_tbps")
        with open(args.json, "w") as f:
            json.dump({"variants": {n: list(d) for n, d in variants}, "rows": rows, "peak_tbps": peak}, f,
                      indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
