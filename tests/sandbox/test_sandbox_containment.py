"""Sandbox containment: no network, read-only system, private /tmp."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from sandbox_helpers import host_path_exists, run_python

from rollout.shared.envs.sandbox import run_sandboxed


async def test_network_is_blocked_even_to_a_host_loopback_server(tmp_path: Path) -> None:
    connections: list[str] = []
    connected = asyncio.Event()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(str(writer.get_extra_info("peername")))
        connected.set()
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        # The server is reachable from the host, so a failure inside is the sandbox's doing.
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await writer.wait_closed()
        await asyncio.wait_for(connected.wait(), 5)
        assert len(connections) == 1

        result = await run_python(
            tmp_path,
            """
            import socket, sys
            try:
                socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
            except OSError as exc:
                print("blocked:", exc)
                sys.exit(0)
            print("connected")
            sys.exit(1)
            """,
            None,
            str(port),
        )
        assert result.exit_code == 0, result.stdout + result.stderr
        assert result.stdout.startswith("blocked:")
        assert len(connections) == 1
    finally:
        server.close()
        await server.wait_closed()


async def test_no_network_interfaces_besides_loopback(tmp_path: Path) -> None:
    result = await run_sandboxed(["cat", "/proc/net/dev"], tmp_path)
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines()[2:]]
    assert interfaces == ["lo"]


async def test_writes_outside_workdir_are_blocked(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    outside = tmp_path / f"outside-{uuid.uuid4().hex}.txt"
    venv_target = Path(__import__("sys").prefix) / f"evil-{uuid.uuid4().hex}"
    targets = [
        "/etc/evil.conf",
        "/usr/evil",
        "/usr/bin/evil",
        str(venv_target),
        f"/evil-{uuid.uuid4().hex}",
        # The test's own host temp dir, next to the work dir: not mounted writable inside.
        str(outside),
    ]
    result = await run_python(
        workdir,
        """
        import sys
        for target in sys.argv[1:]:
            try:
                with open(target, "w") as f:
                    f.write("x")
                print("WROTE", target)
            except OSError as exc:
                print("denied", target, exc.errno)
        """,
        None,
        *targets,
    )
    assert result.exit_code == 0, result.stderr
    assert "WROTE" not in result.stdout
    assert result.stdout.count("denied") == len(targets)
    for target in targets:
        assert not host_path_exists(target)


async def test_tmp_is_private_to_the_run(tmp_path: Path) -> None:
    name = f"/tmp/sandbox-marker-{uuid.uuid4().hex}"
    first = await run_sandboxed(["sh", "-c", f"echo inside > {name} && cat {name}"], tmp_path)
    assert first.exit_code == 0 and first.stdout == "inside\n"
    assert not host_path_exists(name)
    # A later run gets a fresh /tmp too.
    second = await run_sandboxed(["sh", "-c", f"test -e {name}"], tmp_path)
    assert second.exit_code == 1


async def test_host_secrets_and_home_are_not_visible(tmp_path: Path) -> None:
    result = await run_sandboxed(
        ["sh", "-c", "ls /etc; test -e /etc/shadow && echo SHADOW; ls /root 2>&1"], tmp_path
    )
    assert "SHADOW" not in result.stdout
    assert "shadow" not in result.stdout
    assert ".ssh" not in result.stdout


async def test_no_nested_user_namespace_inside_the_sandbox(tmp_path: Path) -> None:
    # Outside the sandbox an unprivileged user may create user namespaces on this kernel, so a
    # refusal inside is the sandbox's doing (root mode: its seccomp filter; else --disable-userns).
    as_user = {"user": 65534} if os.geteuid() == 0 else {}
    outside = await asyncio.to_thread(
        subprocess.run, ["unshare", "-U", "true"], check=False, **as_user
    )
    assert outside.returncode == 0, "this kernel refuses user namespaces: the test proves nothing"
    assert shutil.which("unshare")
    result = await run_python(
        tmp_path,
        """
        import ctypes, os, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        print("unshare", libc.unshare(0x10000000), ctypes.get_errno())
        # clone(CLONE_NEWUSER) is the other way in; os.fork still works (plain clone).
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        print("fork", os.waitpid(pid, 0)[1] >> 8)
        cmd = subprocess.run(["unshare", "-U", "id"], capture_output=True, text=True)
        print("cmd", cmd.returncode, cmd.stderr.strip())
        """,
    )
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "unshare -1 1"  # EPERM
    assert lines[1] == "fork 7"
    assert lines[2].startswith("cmd 1 ") and "Operation not permitted" in lines[2]
