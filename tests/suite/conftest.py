"""The harness's stand-in backends (harness_doubles.py), in the registry for one test."""
from __future__ import annotations

import pytest

import harness_doubles


@pytest.fixture
def doubles():
    with harness_doubles.registered():
        yield
