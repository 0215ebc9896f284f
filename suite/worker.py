"""The worker process: one per GPU, started with multiprocessing 'spawn' so each has its
own CUDA context. It takes (item_id, case, backend) tasks one at a time and answers with
records. After a case that may have killed its context it exits, and the sweep starts a
fresh worker: a dead kernel costs one record, never the sweep."""
from __future__ import annotations

import os
import sys
import traceback
from typing import Any

FATAL_EXIT_CODE = 3


def _redirect_output(log_path: str | None) -> None:
    """Send this process's stdout/stderr (Python and C level) to its log file, so the
    parent's progress bar stays clean and a crash leaves its last words on disk."""
    if not log_path:
        return
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def make_context(device_spec: str, opts: dict[str, Any]):
    """The WorkerContext for 'cpu' or a torch CUDA index ('0', '1', ...)."""
    import torch

    from core.gpu import GpuInfo, torch_uuid
    from suite.envinfo import _nvml, gpu_info, nvml_handle_for
    from suite.runner import WorkerContext

    if device_spec == "cpu":
        return WorkerContext(device=torch.device("cpu"), gpu=GpuInfo.cpu())
    index = int(device_spec)
    torch.cuda.set_device(index)
    nv = _nvml()
    handle = nvml_handle_for(nv, index, torch_uuid(torch.cuda.get_device_properties(index))) if nv else None
    env = gpu_info(nv, handle, index, use_torch=True)
    gpu = GpuInfo.from_torch(index, env)
    ctx = WorkerContext(device=torch.device("cuda", index), gpu=gpu, gpu_env=env, nvml=nv, nvml_handle=handle)
    ceiling = opts.get("known_ceilings", {}).get(device_spec)
    if ceiling and ceiling.get("gpu_name") not in (None, gpu.name):
        ceiling = None  # measured on another GPU model: measure this one
    if ceiling is None and opts.get("read_ceiling", True):
        from suite.readceiling import measure_read_ceiling

        try:
            ceiling = measure_read_ceiling(ctx.device, quick=bool(opts.get("read_ceiling_quick")))
        except Exception as exc:  # noqa: BLE001 - a missing ceiling is a missing column
            ceiling = {"read_ceiling_tbps": None, "method": f"failed: {type(exc).__name__}: {exc}"}
    if ceiling:
        ctx.read_ceiling_tbps = ceiling.get("read_ceiling_tbps")
        env["read_ceiling"] = ceiling
    return ctx


def worker_main(slot: int, device_spec: str, task_q: Any, result_q: Any, opts: dict[str, Any]) -> None:
    """Takes (item_id, case, backend) tasks (the backend object itself, so any backend the
    parent holds runs here, registered or not) and answers with records."""
    _redirect_output(opts.get("log_path"))
    try:
        ctx = make_context(device_spec, opts)
        from suite.runner import gpu_fields, measure, new_record, warm_up
    except BaseException as exc:  # noqa: BLE001
        traceback.print_exc()
        result_q.put(("start_failed", slot, f"{type(exc).__name__}: {exc}"))
        _flush_and_exit(result_q, FATAL_EXIT_CODE)
        return
    result_q.put(("hello", slot, {
        "device": device_spec, "gpu_index": ctx.gpu.index, "gpu_name": ctx.gpu.name,
        "gpu_uuid": ctx.gpu.uuid, "gpu_env": ctx.gpu_env, "pid": os.getpid(),
    }))
    while True:
        task = task_q.get()
        if task is None:
            break
        item_id, case, backend = task
        print(f"[worker {slot}] {backend.name} {case.key}", flush=True)
        # Kernels are built or loaded before the case's timer starts (the parent gives the
        # build a timeout of its own): a JIT compile is not a hang.
        result_q.put(("building", slot, item_id))
        try:
            build_s = warm_up(case, backend, ctx)
        except BaseException:  # noqa: BLE001 - warm_up should not raise; the case will say why
            traceback.print_exc()
            build_s = None
        result_q.put(("start", slot, item_id))
        try:
            record, fatal = measure(case, backend, ctx)
            record.build_s = build_s
        except BaseException as exc:  # noqa: BLE001 - measure() should not raise; be safe
            traceback.print_exc()
            record, fatal = new_record(case, backend, gpu_fields(ctx)), True
            record.reason = f"harness error: {type(exc).__name__}: {exc}"
        if record.traceback:
            print(record.traceback, flush=True)
        _release_memory(ctx)
        result_q.put(("record", slot, item_id, record, fatal))
        if fatal:
            print(f"[worker {slot}] exiting after a fatal error: {record.reason}", flush=True)
            _flush_and_exit(result_q, FATAL_EXIT_CODE)
    _flush_and_exit(result_q, 0)


def _release_memory(ctx) -> None:
    """Drop the finished case's caches and graph pools (the source K/V stays cached)."""
    import gc

    gc.collect()
    if ctx.is_cuda:
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a dead context: the worker is about to exit
            pass


def _flush_and_exit(result_q: Any, code: int) -> None:
    """Make sure queued messages reach the parent, then leave without running CUDA
    teardown in a context that may be broken."""
    try:
        result_q.close()
        result_q.join_thread()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
