"""Report and dashboard load in headless Chromium with no console error and every image drawn (skips w/o chromium)."""
from __future__ import annotations

import pytest

from cdp_browser import find_chromium, load_page

CHROMIUM = find_chromium()
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="headless chromium is not installed (apt-get install chromium)"),
]


def _check(index):
    page = load_page(CHROMIUM, index)
    assert page["errors"] == []
    assert page["images"], f"{index} shows no image"
    for img in page["images"]:
        assert img["complete"] and img["width"] > 0 and img["height"] > 0, img


def test_report_loads_cleanly(rendered_report):
    _check(rendered_report)


def test_dashboard_loads_cleanly(rendered_dashboard):
    _check(rendered_dashboard)


def test_the_check_sees_broken_pages(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img src="missing.png">'
                   '<script>console.error("boom"); throw new Error("thrown")</script></body></html>')
    page = load_page(CHROMIUM, bad)
    text = " ".join(page["errors"])
    assert "ERR_FILE_NOT_FOUND" in text and "boom" in text and "thrown" in text
    assert page["images"][0]["width"] == 0


def test_bundled_report_loads_cleanly(rendered_bundled):
    """`report --bundled`, scaling plots included, as a browser shows it."""
    _check(rendered_bundled)
    assert 'src="scaling_kv_len_nvidia-h200.png"' in rendered_bundled.read_text()
