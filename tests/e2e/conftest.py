"""Fixtures for the end-to-end tier: a real headless Chromium shared by the browser tests.

architecture.md: the board (and the Mediator's panel) are tested in a real headless browser. The
browser is Debian's ``/usr/bin/chromium`` driven by Playwright – ``playwright install`` would
download a browser, and CI has no network – started once per session (about a second) with the
flags that keep it from reaching out to the network or needing a GPU or a sandbox (CI runs as
root). Each test opens its own page in a fresh context, so cookies and storage never leak between
tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """One Chromium for the whole session."""
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A page in a fresh browser context; page errors fail the test that caused them."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(10_000)  # every wait is bounded, well under the 30 s default
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"
