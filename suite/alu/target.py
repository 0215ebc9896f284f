"""The process ncu profiles: prepares one case of one backend through the harness, warms it
up, then runs `iters` decode steps inside the NVTX range ncu filters on.

    python -m suite.alu.target --backend foscar-int4 --case-json '{"batch": 128, ...}'

Exit codes: 0 ran; 2 bad arguments; 3 unsupported (a line `UNSUPPORTED: reason`); 4 no GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable


def prepare_thunk(backend_name: str, case_dict: dict[str, Any]) -> tuple[Callable[[], Any], Any]:
    """The one coupling to the harness: (run thunk, the case the backend really runs).
    Raises LookupError with a reason when the backend cannot run the case."""
    import torch

    from baselines.base import Unsupported, get_backend
    from core.case import Case
    from core.gpu import GpuInfo
    from suite.runner import make_source

    backend = get_backend(backend_name)
    case = backend.case_for(Case.from_dict(case_dict))
    if case is None:
        raise LookupError(f"{backend_name} does not run this case (its KV format differs).")
    reason = backend.supports(case, GpuInfo.from_torch(0))
    if reason:
        raise LookupError(reason)
    try:
        prepared = backend.prepare(case, make_source(case, torch.device("cuda", 0)))
    except Unsupported as exc:
        raise LookupError(str(exc)) from exc
    return prepared.run, case


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", required=True)
    ap.add_argument("--case-json", required=True, help="core.case.Case fields as JSON")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--nvtx-range", default="foscar_alu")
    args = ap.parse_args(argv)
    try:
        case_dict = json.loads(args.case_json)
    except json.JSONDecodeError as exc:
        print(f"--case-json is not JSON: {exc}", file=sys.stderr)
        return 2

    import torch

    if not torch.cuda.is_available():
        print("suite.alu.target needs a CUDA GPU; none is visible.", file=sys.stderr)
        return 4
    try:
        run, case = prepare_thunk(args.backend, case_dict)
    except (LookupError, KeyError) as exc:
        print(f"UNSUPPORTED: {exc}", flush=True)
        return 3
    for _ in range(args.warmup):
        run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(args.nvtx_range)
    for _ in range(args.iters):
        run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(json.dumps({"target": "done", "backend": args.backend, "case": case.key, "iters": args.iters}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
