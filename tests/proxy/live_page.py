"""The live page as a person opens it in a browser, and a wait on it: shared by the live-page tests."""

from __future__ import annotations

import secrets
import time

TOKEN = secrets.token_hex(20)
WAIT_MS = 30_000


def open_page(browser, proxy, token: str | None = TOKEN):
    """The page as a person opens it: load, type the token into the dialog."""
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.on("console", lambda message: page.errors.append(message.text) if message.type == "error" else None)
    page.goto(proxy.admin_url + "/")
    page.wait_for_selector("#token-dialog[open]", timeout=WAIT_MS)
    if token is not None:
        page.fill("#token", token)
        page.press("#token", "Enter")
        page.wait_for_selector("[data-testid=state].live", timeout=WAIT_MS)
    return page


def wait_until(check, what: str) -> None:
    """Poll ``check()`` (the page's CSP forbids Playwright's string predicates)."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
