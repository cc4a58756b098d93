"""An env file's prints and slow loads: stdout stays the command's, a slow load is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from waiting import wait_until_sync

from rollout.shared.envs import load_environments, loader

ROOT = Path(__file__).resolve().parents[2]
REFUND = ROOT / "examples" / "refund_agent.py"


def test_an_env_files_prints_do_not_corrupt_a_json_listing(tmp_path: Path) -> None:
    noisy = tmp_path / "noisy.py"
    noisy.write_text('print("hello from env")\n' + REFUND.read_text())
    done = subprocess.run(
        [sys.executable, "-m", "rollout.cli", "plan", str(noisy), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert document and "hello from env" in done.stderr


def test_a_file_still_loading_is_named_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loader, "SLOW_LOAD_S", 0.1)
    slow = tmp_path / "slow.py"
    # The file loads until the test lets it go on (a byte on a pipe), after the warning.
    read, write = os.pipe()
    slow.write_text(f"import os\nos.read({read}, 1)\n" + REFUND.read_text())
    found: list = []
    with capture_logs() as logs:
        loading = threading.Thread(target=lambda: found.extend(load_environments(slow)))
        loading.start()
        try:
            warned = wait_until_sync(
                lambda: [e for e in logs if e["event"] == "env file still loading"],
                "the still-loading warning",
            )
        finally:
            os.write(write, b"x")  # let it go on, warned or not
            loading.join(timeout=60)
            os.close(read)
            os.close(write)
    assert not loading.is_alive() and found
    assert len(warned) == 1 and warned[0]["file"] == str(slow.resolve())
    assert "loop" in warned[0]["hint"]


def test_a_quick_load_warns_nothing() -> None:
    with capture_logs() as logs:
        load_environments(REFUND)
    assert not [e for e in logs if e["event"] == "env file still loading"]
