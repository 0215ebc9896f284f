"""Dynamic instruction analysis: run one case of a backend under Nsight Compute, read the
pipe and instruction counters, and derive per-KV-element figures and a DRAM cross-check.

Which launches are profiled: the target process (suite.alu.target) warms the backend up,
then calls it `iters` times inside the NVTX push/pop range `foscar_alu`; ncu profiles every
kernel launched inside that range (`--nvtx --nvtx-include foscar_alu/`), optionally only
those whose name matches a regex. A backend that launches two kernels per step (split-KV
main + combine) is summed over both; the sums are divided by `iters`. ncu replays each
kernel once per counter pass with caches flushed between passes (its default), so DRAM
bytes are cold-cache bytes, as the byte model assumes; clocks are left alone
(`--clock-control none`).

Per-element formulas (E = batch x kv_len x num_kv_heads x head_dim x 2, K and V):
- alu_per_elem = smsp__thread_inst_executed_pipe_alu_pred_on.sum / E: thread-level ALU
  instructions whose guard predicate was on. FOSCAR.md's figure.
- alu_issue_per_elem = 32 x smsp__inst_executed_pipe_alu.sum / E: issue slots, as if every
  warp instruction had 32 active threads; predicated-off and partial warps count in full.
  The static SASS count per thread estimates this one. Equal to alu_per_elem for full,
  unpredicated warps.
- inst_per_elem = smsp__thread_inst_executed_pred_on.sum / E, and inst_issue_per_elem =
  32 x smsp__inst_executed.sum / E.
- pipe mix: for each pipe, 32 x smsp__inst_executed_pipe_<pipe>.sum / E, and its share of
  smsp__inst_executed.sum (shares need not sum to 1: NOP, BRA and a few others count in no
  pipe, and fp16x2 work counts in both FMA halves).
- dram_model_ratio = dram__bytes_read.sum / (byte model's bytes read: KV as stored, Q,
  page table; the O write excluded). Outside 1 +- 5% is flagged.
"""
from __future__ import annotations

import csv
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

# Short name -> Nsight Compute counter: the one place counter names live (checked against
# `ncu --query-metrics --chip gh100`, ncu 2025.3). Warp-level unless named thread_*.
METRICS: dict[str, str] = {
    "inst": "smsp__inst_executed.sum",
    "thread_inst": "smsp__thread_inst_executed.sum",
    "thread_inst_pred_on": "smsp__thread_inst_executed_pred_on.sum",
    # warp instructions issued to each pipe
    "pipe_alu": "smsp__inst_executed_pipe_alu.sum",
    "pipe_fma": "smsp__inst_executed_pipe_fma.sum",
    "pipe_fmaheavy": "smsp__inst_executed_pipe_fmaheavy.sum",
    "pipe_fmalite": "smsp__inst_executed_pipe_fmalite.sum",
    "pipe_fp64": "smsp__inst_executed_pipe_fp64.sum",
    "pipe_xu": "smsp__inst_executed_pipe_xu.sum",
    "pipe_lsu": "smsp__inst_executed_pipe_lsu.sum",
    "pipe_adu": "smsp__inst_executed_pipe_adu.sum",
    "pipe_cbu": "smsp__inst_executed_pipe_cbu.sum",
    "pipe_uniform": "smsp__inst_executed_pipe_uniform.sum",
    "pipe_tensor": "smsp__inst_executed_pipe_tensor.sum",
    "pipe_tensor_hmma": "smsp__inst_executed_pipe_tensor_op_hmma.sum",
    "pipe_tensor_gmma": "smsp__inst_executed_pipe_tensor_op_gmma.sum",
    "pipe_tma": "smsp__inst_executed_pipe_tma.sum",
    # thread instructions (guard predicate on) per pipe
    "thread_alu": "smsp__thread_inst_executed_pipe_alu_pred_on.sum",
    "thread_fma": "smsp__thread_inst_executed_pipe_fma_pred_on.sum",
    "thread_xu": "smsp__thread_inst_executed_pipe_xu_pred_on.sum",
    "thread_lsu": "smsp__thread_inst_executed_pipe_lsu_pred_on.sum",
    # thread instructions (guard predicate on) by SASS operation type
    "op_integer": "smsp__sass_thread_inst_executed_op_integer_pred_on.sum",
    "op_bit": "smsp__sass_thread_inst_executed_op_bit_pred_on.sum",
    "op_conversion": "smsp__sass_thread_inst_executed_op_conversion_pred_on.sum",
    "op_fp32": "smsp__sass_thread_inst_executed_op_fp32_pred_on.sum",
    "op_fp16": "smsp__sass_thread_inst_executed_op_fp16_pred_on.sum",
    "op_memory": "smsp__sass_thread_inst_executed_op_memory_pred_on.sum",
    "op_control": "smsp__sass_thread_inst_executed_op_control_pred_on.sum",
    "op_uniform": "smsp__sass_thread_inst_executed_op_uniform_pred_on.sum",
    "op_misc": "smsp__sass_thread_inst_executed_op_misc_pred_on.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "time_ns": "gpu__time_duration.sum",
}
PIPES: tuple[str, ...] = (
    "alu", "fma", "fmaheavy", "fmalite", "fp64", "xu", "lsu", "adu", "cbu", "uniform", "tensor", "tma"
)
NVTX_RANGE = "foscar_alu"
DRAM_TOLERANCE = 0.05
WARP = 32


# --- finding and running ncu ---------------------------------------------------------------


def find_ncu() -> str | None:
    for cand in (os.environ.get("NCU"), shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if cand and Path(cand).exists():
            return cand
    hits = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))
    return hits[-1] if hits else None


def ncu_command(
    ncu: str,
    target: Sequence[str],
    *,
    metrics: Iterable[str] | None = None,
    kernel_regex: str | None = None,
    nvtx_range: str | None = NVTX_RANGE,
    launch_skip: int | None = None,
    launch_count: int | None = None,
    replay_mode: str | None = None,
) -> list[str]:
    names = list(metrics or METRICS.values())
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all"]
    if nvtx_range:
        cmd += ["--nvtx", "--nvtx-include", f"{nvtx_range}/"]
    if kernel_regex:
        cmd += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_skip:
        cmd += ["--launch-skip", str(launch_skip)]
    if launch_count:
        cmd += ["--launch-count", str(launch_count)]
    if replay_mode:
        cmd += ["--replay-mode", replay_mode]
    cmd += ["--metrics", ",".join(names), "--csv", "--page", "raw", "--print-units", "base"]
    return cmd + list(target)


# Output that means ncu itself cannot profile here: (needle, status, sentence for people).
_NCU_FAILURES: tuple[tuple[str, str, str], ...] = (
    ("ERR_NVGPUCTRPERM", "no_permission",
     "ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM): run as root, or load "
     "the driver with NVreg_RestrictProfilingToAdminUsers=0."),
    ("LibraryNotLoaded", "profiler_unusable",
     "ncu could not initialise its profiler here (LibraryNotLoaded); this runtime (e.g. a "
     "gVisor sandbox) does not expose the counters: use a machine where ncu works."),
    ("Failed to initialize the profiler", "profiler_unusable",
     "ncu could not initialise its profiler on this machine."),
    ("No kernels were profiled", "no_kernels",
     "ncu profiled no kernel: the backend launched none inside the NVTX range, or the kernel "
     "regex matched none."),
)


def diagnose(output: str) -> tuple[str, str] | None:
    for needle, status, reason in _NCU_FAILURES:
        if needle in output:
            return status, reason
    return None


# --- CSV -----------------------------------------------------------------------------------

_UNIT_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME_SCALE = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
               "second": 1e9, "s": 1e9}
_PREFIXED = re.compile(r"^(K|M|G|T)?(byte|inst|B|warp|thread|cycle|sector|request)$")


def unit_scale(unit: str) -> float:
    """Factor from a printed unit to the base unit (bytes, instructions, ns)."""
    unit = (unit or "").strip()
    if unit in _TIME_SCALE:
        return _TIME_SCALE[unit]
    m = _PREFIXED.match(unit)
    if m:
        return _UNIT_SCALE[m.group(1) or ""]
    return 1.0


def parse_number(text: str | None) -> float | None:
    """'1,234,567' -> 1234567.0; '2,068.50' -> 2068.5; 'n/a', '', '-' -> None."""
    if text is None:
        return None
    t = text.strip().replace(",", "").replace("\u202f", "").replace(" ", "")
    if t.lower() in ("", "n/a", "na", "-", "nan", "(!)"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


@dataclass
class KernelRow:
    """One profiled kernel launch: its name and its counters (base units)."""

    kernel: str
    id: int
    values: dict[str, float | None]
    info: dict[str, str] = field(default_factory=dict)  # grid, block, ... as printed


def _csv_rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"') or ln.startswith("ID,")), None)
    if start is None:
        return []
    return [r for r in csv.reader(io.StringIO("\n".join(lines[start:]))) if r]


def parse_csv(text: str) -> list[KernelRow]:
    """ncu --csv output, either --page raw (one row per kernel, a units row under the
    header) or --page details (one row per metric). Program output before the header and
    ==PROF== lines are skipped; thousands separators and 'n/a' are handled."""
    rows = _csv_rows(text)
    if not rows:
        return []
    header = rows[0]
    if "Metric Name" in header and "Metric Value" in header:
        return _parse_long(header, rows[1:])
    units: list[str] = [""] * len(header)
    body = rows[1:]
    if body and (not body[0][0].strip() or not body[0][0].strip().isdigit()):
        units, body = body[0], body[1:]  # the units row: empty ID cell
    out = []
    idx = {name: i for i, name in enumerate(header)}
    for r in body:
        if len(r) != len(header) or not r[0].strip().isdigit():
            continue  # a ==PROF== line or the program's own output after the table
        values: dict[str, float | None] = {}
        for name, i in idx.items():
            if "__" not in name:
                continue
            v = parse_number(r[i])
            values[name] = None if v is None else v * unit_scale(units[i] if i < len(units) else "")
        info = {k: r[i] for k, i in idx.items() if "__" not in k}
        out.append(KernelRow(r[idx.get("Kernel Name", 4)], int(r[0]), values, info))
    return out


def _parse_long(header: list[str], body: list[list[str]]) -> list[KernelRow]:
    idx = {name: i for i, name in enumerate(header)}
    by_id: dict[int, KernelRow] = {}
    for r in body:
        if len(r) != len(header) or not r[0].strip().isdigit():
            continue
        kid = int(r[0])
        row = by_id.setdefault(kid, KernelRow(r[idx["Kernel Name"]], kid, {}))
        v = parse_number(r[idx["Metric Value"]])
        unit = r[idx["Metric Unit"]] if "Metric Unit" in idx else ""
        row.values[r[idx["Metric Name"]]] = None if v is None else v * unit_scale(unit)
    return [by_id[k] for k in sorted(by_id)]


# --- aggregation and derivation ------------------------------------------------------------


def per_launch(rows: Sequence[KernelRow], launches: int) -> dict[str, float | None]:
    """Each METRICS short name summed over the profiled kernels, divided by `launches`
    (decode steps run inside the NVTX range). None where no kernel reported the counter."""
    if launches <= 0:
        raise ValueError(f"launches={launches} must be positive.")
    out: dict[str, float | None] = {}
    for short, counter in METRICS.items():
        vals = [r.values.get(counter) for r in rows]
        nums = [v for v in vals if v is not None]
        out[short] = sum(nums) / launches if nums else None
    return out


def kv_elements(case: Any) -> int:
    """K and V elements one decode step attends: batch x kv_len x num_kv_heads x head_dim x 2."""
    return int(case.batch) * int(case.kv_len) * int(case.num_kv_heads) * int(case.head_dim) * 2


def model_read_bytes(traffic: Any) -> int:
    """Bytes the byte model says a step must read: everything but the O write."""
    return int(traffic.total) - int(traffic.o)


def _div(a: float | None, b: float | None, scale: float = 1.0) -> float | None:
    if a is None or not b:
        return None
    return scale * a / b


def derive(per: dict[str, float | None], elements: int, read_bytes: float | None = None) -> dict[str, Any]:
    """Per-element figures from per-launch counters (formulas in the module docstring)."""
    mix = {}
    for pipe in PIPES:
        count = per.get(f"pipe_{pipe}")
        if count is None:
            continue
        mix[pipe] = {
            "per_elem": _div(count, elements, WARP),
            "share": _div(count, per.get("inst")),
        }
    ratio = _div(per.get("dram_read_bytes"), read_bytes)
    return {
        "elements": elements,
        "alu_per_elem": _div(per.get("thread_alu"), elements),
        "alu_issue_per_elem": _div(per.get("pipe_alu"), elements, WARP),
        "inst_per_elem": _div(per.get("thread_inst_pred_on"), elements),
        "inst_issue_per_elem": _div(per.get("inst"), elements, WARP),
        "fma_per_elem": _div(per.get("thread_fma"), elements),
        "xu_per_elem": _div(per.get("thread_xu"), elements),
        "pipe_mix": mix,
        "dram_bytes_read": per.get("dram_read_bytes"),
        "model_read_bytes": read_bytes,
        "dram_model_ratio": ratio,
        "dram_flag": None if ratio is None else abs(ratio - 1.0) > DRAM_TOLERANCE,
        "time_us": _div(per.get("time_ns"), 1000.0),
    }


# --- one case ------------------------------------------------------------------------------


@dataclass
class ProfileResult:
    """What one ncu run of one case gave. `status` is 'ok' or why there are no figures;
    figures are None unless measured."""

    backend: str
    case_key: str
    status: str
    reason: str = ""
    command: list[str] = field(default_factory=list)
    launches: int = 0
    kernels: list[dict] = field(default_factory=list)  # per profiled kernel: name, count
    per_launch: dict[str, float | None] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def store_fields(self) -> dict[str, Any]:
        """The columns `ResultStore.update_record` takes (plus extras for extra_json)."""
        f = self.figures
        return {
            "alu_per_elem": f.get("alu_per_elem"),
            "inst_per_elem": f.get("inst_per_elem"),
            "pipe_mix_json": json.dumps(f.get("pipe_mix")) if f.get("pipe_mix") else None,
            "dram_bytes_read": f.get("dram_bytes_read"),
            "dram_model_ratio": f.get("dram_model_ratio"),
            "alu_issue_per_elem": f.get("alu_issue_per_elem"),
            "inst_issue_per_elem": f.get("inst_issue_per_elem"),
            "alu_status": self.status,
            "alu_reason": self.reason or None,
        }


def summarize_kernels(rows: Sequence[KernelRow]) -> list[dict]:
    seen: dict[str, dict] = {}
    for r in rows:
        k = seen.setdefault(r.kernel, {"kernel": r.kernel, "launches": 0, "inst": 0.0})
        k["launches"] += 1
        k["inst"] += r.values.get(METRICS["inst"]) or 0.0
    return list(seen.values())


def result_from_output(
    backend: str, case: Any, output: str, returncode: int, launches: int, *,
    read_bytes: float | None = None, command: Sequence[str] = (),
) -> ProfileResult:
    """Turns ncu's combined output into a ProfileResult (no figures unless measured)."""
    res = ProfileResult(backend, case.key, "ok", command=list(command), launches=launches)
    rows = parse_csv(output)
    if not rows:
        diag = diagnose(output)
        if diag is None:
            tail = output.strip().splitlines()[-5:]
            diag = ("target_failed" if returncode else "no_kernels",
                    "ncu gave no counters (exit %d): %s" % (returncode, " | ".join(tail)[-600:]))
        res.status, res.reason = diag
        return res
    res.kernels = summarize_kernels(rows)
    res.per_launch = per_launch(rows, launches)
    res.figures = derive(res.per_launch, kv_elements(case), read_bytes)
    return res


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def target_argv(backend: str, case: Any, *, warmup: int, iters: int, nvtx_range: str) -> list[str]:
    return [
        sys.executable, "-m", "suite.alu.target", "--backend", backend,
        "--case-json", json.dumps(case.as_dict()), "--warmup", str(warmup),
        "--iters", str(iters), "--nvtx-range", nvtx_range,
    ]


def profile_case(
    backend: Any,
    case: Any,
    *,
    warmup: int = 3,
    iters: int = 2,
    kernel_regex: str | None = None,
    timeout_s: float = 1800,
    replay_mode: str | None = None,
    ncu: str | None = None,
    log_path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Profiles `iters` decode steps of `backend` (a Backend or its name) on `case` under
    ncu in a child process; returns ProfileResult.as_dict(), whose `case_key` is the case
    the backend really runs (`backend.case_for`). Never raises for a missing or unusable
    ncu: `status` and `reason` say what happened and the figures stay empty."""
    name = getattr(backend, "name", backend)
    case, read_bytes = _own_case(name, case)
    ncu = ncu or find_ncu()
    if ncu is None:
        return ProfileResult(name, case.key, "ncu_missing",
                             "Nsight Compute (ncu) was not found on PATH, in /usr/local/cuda/bin "
                             "or /opt/nvidia/nsight-compute; install it or set NCU=/path/to/ncu."
                             ).as_dict()
    cmd = ncu_command(
        ncu, target_argv(name, case, warmup=warmup, iters=iters, nvtx_range=NVTX_RANGE),
        kernel_regex=kernel_regex, replay_mode=replay_mode,
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_repo_root()), env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s,
                              cwd=_repo_root(), check=False)
    except subprocess.TimeoutExpired:
        return ProfileResult(name, case.key, "timeout", f"ncu ran past {timeout_s:.0f} s.",
                             command=cmd).as_dict()
    output = proc.stdout + "\n" + proc.stderr
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text(" ".join(cmd) + "\n" + output)
    unsupported = re.search(r"^UNSUPPORTED: (.*)$", output, re.M)
    if unsupported:
        return ProfileResult(name, case.key, "unsupported", unsupported.group(1), command=cmd).as_dict()
    res = result_from_output(name, case, output, proc.returncode, iters, read_bytes=read_bytes, command=cmd)
    return res.as_dict()


def own_case(backend: Any, case: Any) -> Any | None:
    """The case `backend` really runs for `case` (its `case_for`); a quantized backend of
    a fixed width (foscar-int2) asked about a case of another width runs that case at its
    own width, so one command can profile INT4 and INT2 backends side by side."""
    own = backend.case_for(case)
    bits = getattr(backend, "bits", 0)
    if own is None and getattr(backend, "quantized", False) and bits and case.k_mode != "none":
        own = backend.case_for(case.with_(bits=bits))
    return own


def _own_case(backend_name: str, case: Any) -> tuple[Any, int | None]:
    """(the case the backend really runs, the byte model's read bytes for it). Falls back
    to (case, None) when the registry or the model cannot say: the ratio is then left
    empty, never guessed."""
    try:
        from baselines.base import get_backend

        backend = get_backend(backend_name)
        own = own_case(backend, case) or case
    except Exception:  # noqa: BLE001
        return case, None
    try:
        return own, model_read_bytes(backend.traffic(own))
    except Exception:  # noqa: BLE001
        return own, None
