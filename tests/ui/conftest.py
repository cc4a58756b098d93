"""Fixtures: a viewer key, a real headless Chromium, screenshots."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rollout.shared.auth.keys import ApiKey, KeyStore
from rollout.shared.auth.roles import Role
from rollout.shared.stack.nats import NatsServer

CHROMIUM = os.environ.get("ROLLOUT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
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
HAVE_CHROMIUM = Path(CHROMIUM).exists()
# Set to a folder (e.g. docs) to keep one screenshot of each page there, named ui-<page>.png.
SHOTS_ENV = "ROLLOUT_UI_SCREENSHOTS"


@pytest.fixture
def viewer_key(nats_server: NatsServer) -> ApiKey:
    """A fresh viewer key the session server accepts (its config reloaded, as `keys create`)."""
    _, key = KeyStore(nats_server.home).create(Role.VIEWER, "ui test viewer")
    nats_server.reload()
    return key


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """Debian's chromium driven by Playwright (no browser download: its own executable)."""
    if not HAVE_CHROMIUM:
        pytest.skip(
            f"no chromium at {CHROMIUM} (apt-get install chromium, or set ROLLOUT_CHROMIUM)"
        )
    playwright_api = pytest.importorskip(
        "playwright.async_api", reason="playwright is not installed (pip install -e '.[dev]')"
    )
    async with playwright_api.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
def shoot(tmp_path: Path) -> Any:
    """`await shoot(page, name)`: a full-page screenshot under tmp (and in $SHOTS_ENV if set)."""
    folder = tmp_path / "screenshots"
    folder.mkdir()
    keep = Path(os.environ[SHOTS_ENV]) if os.environ.get(SHOTS_ENV) else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)

    async def take(page: Any, name: str) -> Path:
        path = folder / f"ui-{name}.png"
        await page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 1000, f"screenshot {name} is empty"
        if keep is not None:
            shutil.copy(path, keep / path.name)
        return path

    return take
