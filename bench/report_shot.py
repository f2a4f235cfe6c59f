"""Opens report.html pages in headless Chromium (the system's, e.g. Debian's ``chromium``) and
saves a screenshot of each, after checking the page drew its plots without console errors.

    python bench/report_shot.py RUN_DIR_OR_REPORT.html OUT.png [RUN2 OUT2.png ...]

Playwright drives the browser (``pip install playwright``); no browser is downloaded: the
system's Chromium is launched by its path. The test suite uses the same function
(tests/test_report_browser.py).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

CHROMIUMS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The system's Chromium (or Chrome) executable, or None."""
    for name in CHROMIUMS:
        found = shutil.which(name)
        if found:
            return found
    return None


def shoot(page: str | Path, png: str | Path, *, width: int = 1400, full_page: bool = True) -> dict[str, Any]:
    """Loads ``page`` (a report.html, or the run folder holding one), waits for its plots, saves
    ``png``; returns the console errors, page errors and plot / svg counts it saw."""
    from playwright.sync_api import sync_playwright

    page = Path(page)
    if page.is_dir():
        page = page / "report.html"
    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found: apt-get install chromium")
    seen: dict[str, Any] = {"console_errors": [], "page_errors": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            tab = browser.new_page(viewport={"width": width, "height": 1000})
            tab.on("console", lambda m: seen["console_errors"].append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            tab.goto(page.resolve().as_uri(), wait_until="load", timeout=120_000)
            tab.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
            tab.wait_for_timeout(500)  # plotly finishes laying out the last figures
            seen["plots"] = tab.locator(".js-plotly-plot").count()
            seen["svgs"] = tab.locator(".js-plotly-plot svg.main-svg").count()
            seen["points"] = tab.locator(".js-plotly-plot .scatterlayer .point").count()
            tab.screenshot(path=str(png), full_page=full_page)
        finally:
            browser.close()
    return seen


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print(__doc__)
        return 2
    for page, png in zip(argv[::2], argv[1::2], strict=True):
        seen = shoot(page, png)
        print(f"{png}: {seen['plots']} plots, {seen['svgs']} svgs, console errors {seen['console_errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
