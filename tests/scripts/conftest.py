"""Shared by the tests of scripts/: each script loaded as a module from its file."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str):
    """scripts/<name>.py as a module (registered in sys.modules: dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def script():
    """load_script, for the tests' own module-scoped fixtures."""
    return load_script
