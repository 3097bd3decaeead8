"""The browser test machinery the tests share (tests/test_browser.py, the wallet SDK's
webview in tests/test_wallet_sdk.py): Debian's ``chromium`` headless through
Playwright's sync API in a phone-sized webview (390x844, touch), and the checks every
Corridor page gets: no 4xx/5xx for any resource (a deliberate error page's own status
is asserted instead), sep24.css applied (computed styles, not merely a ``<link>``),
sep24.js run (``<html data-sep24js="ready">``), then a screenshot under
``test-artifacts/screenshots/``. The fixtures ``playwright`` and ``page`` (tests/conftest.py)
are built from :func:`start_playwright` and :func:`open_page`.

Needs ``/usr/bin/chromium`` (``apt-get install chromium``; never ``playwright install``,
README "SEP-24 pages and browser tests"). Without it the tests that use it skip saying
so -- except under ``CI=true``, where they fail."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS

CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
# The machine's closed network refuses Chromium's background connections: keep it from
# making any (python.md, "Known to work").
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2,
         "is_mobile": True, "has_touch": True, "locale": "en-IN"}
SHOTS = ARTIFACTS / "screenshots"
DEFAULT_TIMEOUT_MS = 15_000  # Playwright's wait for any one action or expectation
STATUS_LOOK_MS = 300  # wait_for_status: between two looks at the status page


def unavailable(message: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: browser tests never skip)")
    pytest.skip(message)


@contextlib.contextmanager
def start_playwright() -> Iterator[object]:
    """Playwright's sync API, with the Django ORM allowed beside it: Playwright keeps
    its event loop marked running in this thread between calls, which Django would
    otherwise take for async code (the test itself is plain sync code). Skips (fails
    under CI=true) without Chromium or Playwright."""
    if not CHROMIUM.exists():
        unavailable(f"browser tests need Debian's chromium at {CHROMIUM}: "
                    "apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("browser tests need playwright: pip install -r requirements-dev.txt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as p:
            yield p


class Responses:
    """Every response the page's browser receives (documents, styles, scripts, XHR)."""

    def __init__(self, page):
        self.seen: list[tuple[int, str, str]] = []
        page.on("response", lambda r: self.seen.append((r.status, r.request.resource_type,
                                                        r.url)))

    def take(self) -> list[tuple[int, str, str]]:
        seen, self.seen = self.seen, []
        return seen


@contextlib.contextmanager
def open_page(playwright, profile: Path) -> Iterator[object]:
    """A phone-sized page in a fresh Chromium profile (its own user-data-dir
    ``profile``), with its responses recorded in ``page.responses``."""
    context = playwright.chromium.launch_persistent_context(
        str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
        **PHONE)
    try:
        context.set_default_timeout(DEFAULT_TIMEOUT_MS)
        page = context.pages[0] if context.pages else context.new_page()
        page.responses = Responses(page)
        yield page
    finally:
        context.close()


def assert_no_failed_responses(page, *, document_status: int | None = None) -> None:
    """No response >= 400 since the last check, except the main document of a
    deliberate error page, whose status must then be ``document_status``."""
    seen = page.responses.take()
    failed = [r for r in seen if r[0] >= 400 and not (r[1] == "document"
                                                      and r[0] == document_status)]
    assert failed == [], f"failed responses: {failed}"
    if document_status is not None:
        assert (document_status, "document") in {(s, t) for s, t, _ in seen}, seen


def assert_page_works(page, *, document_status: int | None = None) -> None:
    """A Corridor page as the customer sees it: every resource loaded, sep24.css applied
    (its ``--brand`` custom property and the page background it sets), sep24.js run."""
    from playwright.sync_api import Error as PlaywrightError

    for attempt in range(3):  # a status page may reload itself (meta refresh) meanwhile
        try:
            page.wait_for_function("document.documentElement.dataset.sep24js === 'ready'",
                                   timeout=5_000)
            styles = page.evaluate("""() => {
                const root = getComputedStyle(document.documentElement);
                const body = getComputedStyle(document.body);
                return {brand: root.getPropertyValue('--brand').trim(),
                        bg: body.backgroundColor, margin: body.marginTop};
            }""")
            break
        except PlaywrightError as exc:
            if "context was destroyed" not in str(exc) or attempt == 2:
                raise
    assert styles == {"brand": "#1f5eff", "bg": "rgb(244, 245, 247)", "margin": "0px"}
    assert_no_failed_responses(page, document_status=document_status)


def shot(page, name: str, *, document_status: int | None = None,
         corridor: bool = True) -> None:
    """Check the page (``assert_page_works``; only no failed responses on another
    site's page, ``corridor=False``) and save its screenshot."""
    if corridor:
        assert_page_works(page, document_status=document_status)
    else:
        assert_no_failed_responses(page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def expect(locator):
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


def assert_fits_the_phone(page) -> None:
    """No sideways scrolling in a 390 px webview."""
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def wait_for_status(page, status: str, *, tick=None, timeout: float = 30.0) -> None:
    """Wait for the status page (refreshing itself) to show ``status``; ``tick`` runs
    between looks, as beat would run the poller."""
    deadline = time.monotonic() + timeout
    while not page.locator(f'section.status[data-status="{status}"]').count():
        if time.monotonic() > deadline:
            raise AssertionError(f"status page never showed {status}: "
                                 f"{page.locator('section.status').inner_text()}")
        if tick:
            tick()
        page.wait_for_timeout(STATUS_LOOK_MS)
