"""Report-test fixtures: one two-commit store per session, and its report and dashboard rendered once."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # plain `pytest` without the package installed
    sys.path.insert(0, str(ROOT))

from reports_fixture import build_store  # noqa: E402


@pytest.fixture(scope="session")
def fixture_store(tmp_path_factory):
    """(db path, base run id, head run id) of a store with two commits of an H200 sweep."""
    db = tmp_path_factory.mktemp("store") / "results.sqlite"
    base, head = build_store(db)
    return db, base, head


@pytest.fixture(scope="session")
def rendered_report(fixture_store, tmp_path_factory) -> Path:
    """index.html of the report of the HEAD run."""
    from reports.report import build_report
    from reports.source import open_store, select_runs

    db, _, head = fixture_store
    return build_report(select_runs(open_store(db), [head]), tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="session")
def rendered_dashboard(fixture_store, tmp_path_factory) -> Path:
    """index.html of the dashboard over both commits."""
    from reports.dashboard import build_dashboard
    from reports.source import open_store

    db, _, _ = fixture_store
    return build_dashboard(open_store(db), tmp_path_factory.mktemp("dashboard"))


@pytest.fixture(scope="session")
def rendered_bundled(tmp_path_factory) -> Path:
    """index.html of `report --bundled` (every bundled run, the bundled read floor)."""
    from reports.report import build_report
    from reports.source import open_bundled, select_runs
    from suite.commands.report import speedup_bound

    results = select_runs(open_bundled(), ["all"])
    return build_report(results, tmp_path_factory.mktemp("bundled"), bound=speedup_bound(results, None, True))
