"""Stand-in backends that exist only to test the harness. They are no part of the product:
the harness's tests put them in the registry for one test at a time (the `doubles` fixture
in tests/suite/conftest.py), and a sweep hands each worker its backend object, so the
worker processes need no registration of their own.

test-crash makes a real illegal memory access on the GPU, to prove that a case which kills
its CUDA context is recorded `crashed` and the sweep goes on in a fresh worker. The others
simulate failures on the CPU: a prepare that raises, a worker process that dies, a hang,
a wrong answer (ours: `incorrect`, untimed; a third party's: `inaccurate`, timed), an
output left unwritten, kernels that take long to build.
"""
from __future__ import annotations

import contextlib
import os
import time

import pytest

from baselines import base
from baselines.base import Backend, GpuInfo, Prepared, SourceKV
from core.case import Case


def torch_attention(q, k, v, sm_scale: float):
    """Float32 attention for the stand-ins: q [b, hq, d], k/v [b, n, hkv, d]."""
    import torch

    b, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.float().view(b, hkv, hq // hkv, d)
    kh, vh = k.float().transpose(1, 2), v.float().transpose(1, 2)
    p = torch.softmax(torch.matmul(qg, kh.transpose(-1, -2)) * sm_scale, dim=-1)
    return torch.matmul(p, vh).reshape(b, hq, d)


class _HarnessTestBackend(Backend):
    family = "test"
    needs_cuda = False
    bits = 16
    tolerance = 1e-2
    kv_format = "bf16"

    def warmup_case(self, case: Case) -> Case | None:
        return None  # nothing to build; a warm-up would meet their planted failures first

    def _stub(self, case: Case, source: SourceKV, transform=None) -> Prepared:
        import torch

        out = torch.empty_like(source.q)

        def run():
            o = torch_attention(source.q, source.k, source.v, source.sm_scale)
            out.copy_(transform(o) if transform else o)
            return out

        return Prepared(
            run=run,
            reference_kv=lambda idx: (source.k[list(idx)], source.v[list(idx)]),
            out=out,
        )


class StubBackend(_HarnessTestBackend):
    name = "test-stub"
    description = "stand-in: float32 torch attention over the BF16 source (CPU or GPU)"

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        return self._stub(case, source)


class WrongBackend(_HarnessTestBackend):
    name = "test-wrong"
    description = "stand-in whose answer is 10% off: must be recorded `incorrect`, untimed"

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        return self._stub(case, source, transform=lambda o: o * 1.1)


class WrongBaselineBackend(_HarnessTestBackend):
    name = "test-wrong-baseline"
    third_party = True
    description = "another project's stand-in, 10% off: recorded `inaccurate`, timed and flagged"

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        return self._stub(case, source, transform=lambda o: o * 1.1)


_BUILT_IN_THIS_PROCESS = False


class SlowBuildBackend(_HarnessTestBackend):
    name = "test-slow-build"
    description = "stand-in whose first prepare in a process takes build_s (a JIT compile)"
    build_s = 3.0

    def warmup_case(self, case: Case) -> Case | None:
        return Backend.warmup_case(self, case)

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        global _BUILT_IN_THIS_PROCESS
        if not _BUILT_IN_THIS_PROCESS:
            time.sleep(self.build_s)
            _BUILT_IN_THIS_PROCESS = True
        return self._stub(case, source)


class UnwrittenBackend(_HarnessTestBackend):
    name = "test-unwritten"
    description = "stand-in that never writes its output buffer: the poison must show"

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        import torch

        out = torch.empty_like(source.q)
        return Prepared(run=lambda: out, reference_kv=lambda idx: (source.k[list(idx)], source.v[list(idx)]),
                        out=out)


class RaisingBackend(_HarnessTestBackend):
    name = "test-raise"
    description = "stand-in whose prepare raises: recorded `crashed` with the error text"

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        raise RuntimeError("planted failure in prepare (test-raise)")


class UnsupportedBackend(_HarnessTestBackend):
    name = "test-unsupported"
    description = "stand-in that supports nothing"

    def case_reason(self, case: Case, gpu: GpuInfo | None) -> str | None:
        return "test-unsupported supports no case, by design."

    def prepare(self, case: Case, source: SourceKV) -> Prepared:  # pragma: no cover
        raise AssertionError("prepare must not be called for an unsupported case")


class ExitingBackend(_HarnessTestBackend):
    name = "test-exit"
    description = "stand-in whose first run kills its worker process (exit code 17)"

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        def run():
            os._exit(17)

        return Prepared(run=run, reference_kv=lambda idx: (source.k, source.v), bytes=1)


class HangingBackend(_HarnessTestBackend):
    name = "test-hang"
    description = "stand-in whose run never returns: recorded `timeout`, worker replaced"

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        def run():
            time.sleep(3600)

        return Prepared(run=run, reference_kv=lambda idx: (source.k, source.v), bytes=1)


class CrashingBackend(_HarnessTestBackend):
    name = "test-crash"
    needs_cuda = True
    description = "makes an illegal memory access on the GPU (kills the CUDA context)"

    def case_reason(self, case: Case, gpu: GpuInfo | None) -> str | None:
        if gpu is None or gpu.sm == 0:
            return "test-crash needs a CUDA GPU to crash."
        return None

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        dev = source.q.device

        def run():
            illegal_access(dev)
            return source.q

        return Prepared(run=run, reference_kv=lambda idx: (source.k, source.v), bytes=1)


def illegal_access(device) -> None:
    """Store far outside any allocation (Triton); without Triton, an out-of-bounds index,
    whose device-side assert is just as fatal to the context."""
    import torch

    x = torch.zeros(16, device=device)
    try:
        import triton
        import triton.language as tl
    except Exception:  # noqa: BLE001
        idx = torch.full((1,), 1 << 30, device=device, dtype=torch.long)
        x[idx] = 1.0
        torch.cuda.synchronize(device)
        return

    @triton.jit
    def _store_far(ptr, offset):
        tl.store(ptr + offset, 1.0)

    _store_far[(1,)](x, 1 << 40)
    torch.cuda.synchronize(device)


DOUBLES = (StubBackend, WrongBackend, WrongBaselineBackend, SlowBuildBackend, UnwrittenBackend, RaisingBackend,
           UnsupportedBackend, ExitingBackend, HangingBackend, CrashingBackend)


@contextlib.contextmanager
def registered():
    """The stand-ins findable by name (as `sweep --backends test-stub` finds them) while open."""
    base.all_backends()  # the real ones first, so their listing order stays theirs
    with pytest.MonkeyPatch.context() as mp:
        for cls in DOUBLES:
            mp.setitem(base._REGISTRY, cls.name, cls())
        yield
