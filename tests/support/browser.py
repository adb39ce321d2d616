"""The browser for page tests: one Chromium per test module (a fixture registered once, in
tests/conftest.py), a fresh context per page, and screenshots under var/screenshots.

Playwright's sync API runs an event loop in the test's thread for as long as it is open, so two
`sync_playwright()` at once in one process fail; that is why there is exactly one, here."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

# Live-server tests drive the browser from the test's thread while Django's ORM runs sync code there.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"


def ensure_chromium() -> str:
    """Debian's chromium; installed with apt-get when missing (the test machine runs as root)."""
    if not Path(CHROMIUM).exists():
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            raise RuntimeError(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)
    return CHROMIUM


@pytest.fixture(scope="module")
def browser():
    """One Chromium per test module: the sync API's loop stays in this thread only while a page
    test module runs, not for the rest of the session."""
    executable = ensure_chromium()
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def new_page(browser):
    """`new_page(mobile=False)`: a page in its own context (own cookies), closed after the test."""
    contexts = []

    def make(*, mobile: bool = False):
        options = {"viewport": {"width": 390, "height": 844}, "is_mobile": True} if mobile else \
            {"viewport": {"width": 1400, "height": 1000}}
        context = browser.new_context(**options)
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
