"""The disk budget: what sandboxed code adds to the writable host folders is capped in total."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

from sandbox_helpers import run_python

from rollout.shared.envs.disk_budget import measure
from rollout.shared.envs.sandbox import SandboxLimits, run_sandboxed, run_sandboxed_with_peer

MB = 1024 * 1024
# The overshoot disk_budget states: about one watch interval of writing plus the kill.
OVERSHOOT = 256 * MB

# 20 files of 50 MB: each under the per-file limit (RLIMIT_FSIZE), 1 GB in all.
FILL = """
import os, sys
where = sys.argv[1] if len(sys.argv) > 1 else "."
chunk = b"x" * (1 << 20)
for i in range(20):
    with open(os.path.join(where, f"big{i}"), "wb") as f:
        for _ in range(50):
            f.write(chunk)
print("wrote 1 GB")
"""


# Reads the pipe from the peer until the peer ends.
WAIT_FOR_PEER = (
    "import os\n"
    "r = int(os.environ['ROLLOUT_PEER_FDS'].split(',')[0])\n"
    "while os.read(r, 65536):\n"
    "    pass\n"
)


def _used(*folders: Path) -> int:
    return measure(list(folders), 10**7).bytes


async def test_many_files_under_the_file_limit_are_stopped_at_the_budget(tmp_path: Path) -> None:
    limits = SandboxLimits(max_disk_bytes=256 * MB, wall_seconds=60)
    try:
        result = await run_python(tmp_path, FILL, limits)
        assert result.killed_reason == "disk_limit", (result.exit_code, result.stderr[-500:])
        assert result.exit_code is None and "wrote 1 GB" not in result.stdout
        used = _used(tmp_path)
        assert 256 * MB < used < 256 * MB + OVERSHOOT, used
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


async def test_a_writable_bind_counts_in_the_budget(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    (work / "fill.py").write_text(FILL)
    limits = SandboxLimits(max_disk_bytes=128 * MB, wall_seconds=60)
    try:
        result = await run_sandboxed(
            [sys.executable, "fill.py", str(out)], work, limits, binds=[(out, True)]
        )
        assert result.killed_reason == "disk_limit", (result.exit_code, result.stderr[-500:])
        assert _used(work, out) < 128 * MB + OVERSHOOT
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


async def test_a_peer_writing_its_own_bind_is_stopped_too(tmp_path: Path) -> None:
    work, scratch = tmp_path / "work", tmp_path / "scratch"
    work.mkdir()
    scratch.mkdir(mode=0o1777)
    scratch.chmod(0o1777)
    (work / "fill.py").write_text(FILL)
    limits = SandboxLimits(max_disk_bytes=128 * MB, wall_seconds=60)
    try:
        result = await run_sandboxed_with_peer(
            [sys.executable, "-c", WAIT_FOR_PEER],
            [sys.executable, str(work / "fill.py"), str(scratch)],
            work,
            limits,
            peer_binds=[(scratch, True)],
        )
        assert result.killed_reason == "disk_limit", (result.exit_code, result.stderr[-500:])
        assert _used(work, scratch) < 128 * MB + OVERSHOOT
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


async def test_many_empty_files_are_stopped_by_the_file_count(tmp_path: Path) -> None:
    limits = SandboxLimits(max_disk_files=2_000, wall_seconds=60)
    try:
        result = await run_python(
            tmp_path,
            """
            import os
            os.mkdir("many")
            for i in range(200_000):
                open(f"many/{i}", "w").close()
            print("made them all")
            """,
            limits,
        )
        assert result.killed_reason == "disk_limit", (result.exit_code, result.stderr[-500:])
        assert "made them all" not in result.stdout
        assert len(list((tmp_path / "many").iterdir())) < 100_000
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


async def test_an_honest_run_writing_a_few_mb_is_unchanged(tmp_path: Path) -> None:
    (tmp_path / "given.txt").write_bytes(b"y" * (2 * MB))  # there before: not its writing
    result = await run_python(
        tmp_path,
        """
        import os
        os.makedirs("out/sub")
        for i in range(30):
            with open(f"out/sub/f{i}", "wb") as f:
                f.write(os.urandom(100_000))
        print("ok", sum(os.path.getsize(f"out/sub/f{i}") for i in range(30)))
        """,
        SandboxLimits(max_disk_bytes=8 * MB, wall_seconds=60),
    )
    assert result.exit_code == 0 and result.killed_reason is None, result.stderr
    assert result.stdout.split() == ["ok", "3000000"]


async def test_one_file_cannot_pass_the_budget(tmp_path: Path) -> None:
    # RLIMIT_FSIZE is lowered to the budget: a single file is stopped by the kernel itself.
    result = await run_python(
        tmp_path,
        textwrap.dedent(
            """
            with open("one", "wb") as f:
                f.write(b"x" * (8 << 20))
            """
        ),
        SandboxLimits(max_disk_bytes=4 * MB, wall_seconds=60),
    )
    # Python ignores SIGXFSZ: the write fails with EFBIG instead.
    assert result.exit_code == 1 and "File too large" in result.stderr
    assert (tmp_path / "one").stat().st_size <= 4 * MB


async def test_files_hidden_in_a_folder_made_unreadable_are_stopped(tmp_path: Path) -> None:
    # Unprivileged callers cannot look into a folder the sandbox chmods 000 (root can): either
    # way what is written through files opened before the chmod must not escape the budget.
    limits = SandboxLimits(max_disk_bytes=64 * MB, wall_seconds=30)
    try:
        result = await run_python(
            tmp_path,
            """
            import os, time
            os.mkdir("hide")
            files = [open(f"hide/f{i}", "wb") for i in range(10)]
            os.chmod("hide", 0)
            chunk = b"x" * (1 << 20)
            for f in files:
                for _ in range(50):
                    f.write(chunk)
                f.flush()
            time.sleep(20)
            print("hid 500 MB")
            """,
            limits,
        )
        assert result.killed_reason == "disk_limit", (result.exit_code, result.stderr[-500:])
        assert result.duration_s < 10
    finally:
        (tmp_path / "hide").chmod(0o755)
        shutil.rmtree(tmp_path, ignore_errors=True)


async def test_dev_is_read_only_and_dev_shm_is_small(tmp_path: Path) -> None:
    # bwrap's /dev is an unsized tmpfs (half the host's RAM), writable by the sandbox user
    # when the caller is unprivileged; /dev/shm must stay usable (multiprocessing's locks).
    result = await run_python(
        tmp_path,
        """
        import multiprocessing, os
        try:
            open("/dev/fill", "wb").close()
            print("dev writable")
        except OSError as exc:
            print("dev", exc.strerror)
        st = os.statvfs("/dev/shm")
        print("shm MiB", st.f_blocks * st.f_frsize >> 20)
        lock = multiprocessing.Lock()
        lock.acquire()
        lock.release()
        with open("/dev/null", "w") as f:
            f.write("still a device")
        print("lock ok")
        """,
        SandboxLimits(wall_seconds=30),
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["dev Read-only file system", "shm MiB 64", "lock ok"]
