"""The measured read ceiling: a streaming-read kernel (16-byte loads over a >= 2 GiB buffer,
persistent grid, XOR-reduced so nothing is optimised away), run once per GPU per sweep.
Its TB/s is what a decode kernel's effective bandwidth is also compared to, beside the
bus-derived and datasheet peaks."""
from __future__ import annotations

import statistics
from typing import Any

BUFFER_BYTES = 2 << 30
BLOCK = 2048  # int32 per program per step: 4 warps x 32 lanes x 16 int32 = 4 x 16-byte loads a lane
REPS = 20


def _triton_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def stream_read(x_ptr, out_ptr, n_blocks, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for blk in range(pid, n_blocks, nprog):
            ptrs = x_ptr + blk.to(tl.int64) * BLOCK + offs
            acc ^= tl.load(ptrs, cache_modifier=".cg")
        tl.store(out_ptr + pid * BLOCK + offs, acc)

    return stream_read


def measure_read_ceiling(device: Any, nbytes: int = BUFFER_BYTES, reps: int = REPS) -> dict[str, Any]:
    """{'read_ceiling_tbps', 'method', 'bytes', 'median_us'}; Triton when present, else a
    torch reduction (slower than a tuned kernel: recorded as such)."""
    import torch

    n = nbytes // 4 // BLOCK * BLOCK
    x = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device=device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count

    def torch_run():
        x.sum()

    try:
        kernel = _triton_kernel()
        grid = sms * 8
        out = torch.empty(grid * BLOCK, dtype=torch.int32, device=device)

        def run():
            kernel[(grid,)](x, out, n // BLOCK, BLOCK=BLOCK, num_warps=4)

        run()  # compiles here, so a failure falls back below
        torch.cuda.synchronize(device)
        method = "triton stream_read (16-byte loads, .cg)"
    except Exception as exc:  # noqa: BLE001 - no Triton: a torch reduction stands in
        run = torch_run
        method = f"torch int32 sum (no Triton: {type(exc).__name__})"
    for _ in range(3):
        run()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        torch.cuda.synchronize(device)
        times.append(s.elapsed_time(e) * 1e3)
    med = statistics.median(times)
    bytes_read = n * 4
    return {
        "read_ceiling_tbps": bytes_read / (med * 1e-6) / 1e12,
        "method": method,
        "bytes": bytes_read,
        "median_us": med,
    }
