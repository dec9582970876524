"""Browser tests: Playwright driving Debian's Chromium (installed by scripts/setup-servers.sh).

One browser per test module (``browser`` is module-scoped, on the module's event
loop): a module marks its tests ``pytest.mark.asyncio(loop_scope="module")``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from playwright.async_api import Browser, async_playwright, expect

CHROMIUM = os.environ.get("SHARDGATE_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# a page waits on the gate (a reshard's write switch, a VDiff): on a loaded 2-core machine
# that takes longer than expect()'s default 5 s
expect.set_options(timeout=20_000)

#: set to 1 to rewrite the screenshots in docs/console/ (`make console-screenshots`)
SCREENSHOTS_ENV = "SHARDGATE_SCREENSHOTS"


def screenshots_wanted() -> bool:
    """Whether this run rewrites docs/console/*.png (only when asked: they are in git)."""
    return os.environ.get(SCREENSHOTS_ENV) == "1"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup-servers.sh (it installs "
                    "Debian's chromium)", pytrace=False)
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            await b.close()
