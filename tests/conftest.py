"""Shared test set-up: `gpu` tests skip cleanly without CUDA; `rng` gives each test its own seed."""
from __future__ import annotations

import os
import zlib

# numpy's OpenBLAS starts a thread per core and, beside torch's own pool, costs far more than it
# saves on this suite's matrices: on a 2-core box a [4, 131072] @ [131072, 128] product took
# 1.7-1.9 s with its 2 threads and 0.02 s with 1. The variable is read when numpy loads, so it is
# set here, before anything imports numpy; subprocesses the tests start inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest
import torch

# The tests use small tensors, where intra-op threads cost more than they save: on a 2-core
# box tests/foscar took 43 s with 2 threads and 15 s with 1.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request) -> torch.Generator:
    """A CPU generator seeded from the test's id: fresh data per test, the same on every run."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))
