"""Shared test set-up: `gpu` tests skip cleanly without CUDA; `rng` gives each test its own seed."""
from __future__ import annotations

import zlib

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
