"""`rollout up / status / down` on real servers: health, persistence, restarts, clear failures."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path

import asyncpg
import nats
import nats.errors
import pytest
from waiting import wait_until_sync

from rollout.shared.settings import Settings, connect_nats, load_settings
from rollout.shared.stack.nats import NatsServer
from rollout.shared.stack.supervisor import cli_command, read_state

from .conftest import Cli, stack_env


def _status(cli: Cli) -> tuple[int, dict]:
    result = cli("status", "--json")
    return result.returncode, json.loads(result.stdout)


def _unhealthy(doc: dict) -> list[dict]:
    """The components `status` found unhealthy (what a failed assert should show)."""
    return [c for c in doc["components"] if not c["healthy"]]


def _healthy_status(cli: Cli) -> dict:
    """`status --json` once it says healthy, within a deadline (else the unhealthy components).

    `status` probes live, each probe with a short timeout: on a loaded machine one can miss
    once right after `up` returned ready, so a test that means "up left it healthy" waits.
    """
    seen: list[dict] = []

    def healthy() -> bool:
        code, doc = _status(cli)
        seen[:] = [doc]
        return code == 0

    try:
        wait_until_sync(healthy, "a healthy status", 30, interval_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {_unhealthy(seen[0])}") from None
    return seen[0]


def _up(cli: Cli, *extra: str) -> None:
    result = cli("up", *extra)
    assert result.returncode == 0, result.stderr + result.stdout


async def _write_data(settings: Settings) -> None:
    nc = await connect_nats(settings)
    js = nc.jetstream()
    await js.add_stream(name="KEEP", subjects=["keep.>"])
    await js.publish("keep.one", b"survives restarts")
    await nc.close()
    assert settings.database_url
    conn = await asyncpg.connect(settings.database_url)
    await conn.execute("create table kept (note text)")
    await conn.execute("insert into kept values ('survives restarts')")
    await conn.close()


async def _read_data(settings: Settings) -> tuple[bytes, str]:
    nc = await connect_nats(settings)
    msg = await nc.jetstream().get_msg("KEEP", 1)
    await nc.close()
    assert settings.database_url
    conn = await asyncpg.connect(settings.database_url)
    note = await conn.fetchval("select note from kept")
    await conn.close()
    return msg.data, note


async def test_up_status_down_up_keeps_events_and_rows(cli: Cli) -> None:
    code, doc = _status(cli)
    assert code == 1 and doc["healthy"] is False

    _up(cli)
    doc = _healthy_status(cli)
    by_name = {c["name"]: c for c in doc["components"]}
    assert set(by_name) == {"nats", "postgres", "idle"}
    assert all(c["healthy"] and c["pid"] for c in doc["components"])
    assert by_name["nats"]["address"].startswith("nats://127.0.0.1:")
    assert len(by_name["idle"]["replicas"]) == 1

    home = cli.home
    for secret in ("credentials.json", "state.json", "nats/nats.conf"):
        assert (home / secret).stat().st_mode & 0o777 == 0o600, secret
    settings = load_settings(cli.env)
    await _write_data(settings)

    down = cli("down")
    assert down.returncode == 0 and "nats" in down.stdout and "postgres" in down.stdout
    code, doc = _status(cli)
    assert code == 1 and not any(c["healthy"] for c in doc["components"])
    assert read_state(home)["phase"] == "stopped"

    _up(cli)
    assert await _read_data(load_settings(cli.env)) == (b"survives restarts", "survives restarts")
    _healthy_status(cli)
    # A second `up` while running is a no-op that reports the same healthy stack.
    assert cli("up").returncode == 0


async def test_status_names_a_jetstream_that_can_no_longer_write(cli: Cli) -> None:
    # A full disk: nats-server still takes connections and answers JetStream's account info,
    # but stores nothing more (even once space is freed, until it restarts). Its own health
    # check says why; `status` must too, not "healthy" over services with "no live heartbeat".
    # A file-size limit on the running server fails its writes as a full disk does.
    _up(cli)
    settings = load_settings(cli.env)
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await js.add_stream(name="FULL", subjects=["full.>"])
        resource.prlimit(read_state(cli.home)["nats"]["pid"], resource.RLIMIT_FSIZE, (1, 1))
        with pytest.raises(nats.errors.Error):
            await js.publish("full.one", b"x" * 4096, timeout=5)
    finally:
        await nc.close()

    def reported() -> dict | None:
        code, doc = _status(cli)
        nats_line = _component(doc, "nats")
        return nats_line if code == 1 and nats_line and not nats_line["healthy"] else None

    try:
        line = wait_until_sync(reported, "status to call nats unhealthy", 30, interval_s=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {_component(_status(cli)[1], 'nats')}") from None
    assert "write error" in line["detail"] and "file too large" in line["detail"], line
    assert "FULL" in line["detail"], line
    assert "rollout down" in line["detail"], line
    assert "nats-server says: JetStream stream" in cli("status").stdout


def test_a_state_file_it_cannot_write_does_not_end_supervision(cli: Cli) -> None:
    # On a full disk the supervisor cannot record its state. A service that dies then must still
    # be restarted; the failed write used to end that service's supervision, so it stayed down
    # even once the disk had room. A folder in the state file's place fails the supervisor's
    # reads and writes of it as a full disk fails its writes.
    _up(cli)
    state_file = cli.home / "state.json"
    before = read_state(cli.home)
    supervisor, idle = before["supervisor"]["pid"], before["services"]["idle"]["pid"]
    state_file.rename(cli.home / "state.saved")
    state_file.mkdir()
    try:
        os.kill(idle, signal.SIGKILL)

        def restarted() -> list[int]:
            return [pid for pid in _children(supervisor) if pid != idle and _serves(pid, "idle")]

        wait_until_sync(restarted, "the killed service restarted", 30, interval_s=0.1)
    finally:
        state_file.rmdir()
        (cli.home / "state.saved").rename(state_file)
    assert _alive(supervisor)


def _children(pid: int) -> list[int]:
    """The live child processes of `pid`."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(stat.parent.name))
    return children


def _serves(pid: int, service: str) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"serve" in argv and service.encode() in argv


def test_a_state_file_deleted_or_broken_while_up_is_written_again(cli: Cli) -> None:
    # `status`, `up` and `down` find the stack through the state file. With it deleted by hand
    # (as a broken one's error says to), a running stack read as stopped, `up` waited its whole
    # timeout and `down` said nothing was running: only kill could stop it.
    _up(cli)
    supervisor = read_state(cli.home)["supervisor"]["pid"]
    state_file = cli.home / "state.json"
    for damage in ("deleted", "broken"):
        if damage == "deleted":
            state_file.unlink()
        else:
            state_file.write_text('{"phase": "rea')
        wait_until_sync(
            lambda: cli("status").returncode == 0,
            f"a healthy status after the state file was {damage}",
            30,
            interval_s=0.2,
        )
    result = cli("down")
    assert "supervisor" in result.stdout and "idle" in result.stdout, result.stdout
    assert not _alive(supervisor)


def test_down_when_nothing_runs(cli: Cli) -> None:
    result = cli("down")
    assert result.returncode == 0
    assert "nothing was running" in result.stdout


@pytest.mark.slow
def test_crashed_processes_are_restarted(stack_home: Path) -> None:
    home = stack_home
    cli = Cli(home=home, env=stack_env(home, services="crash_once"))
    try:
        _up(cli)

        # The first process may beat once before it crashes, so `up` can return before the
        # restart: wait for the restarted replica (restarts are asynchronous by design).
        def restarted() -> bool:
            restarts = _entry(home, ("services", "crash_once")).get("restarts")
            return restarts == 1 and _status(cli)[0] == 0

        try:
            wait_until_sync(restarted, "the restarted replica", 60, interval_s=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {_component(_status(cli)[1], 'crash_once')}") from None
        assert (home / "crashed-once").exists()
        # Killing the running replica, or nats-server itself: the supervisor starts new ones.
        for path in (("services", "crash_once"), ("nats",)):
            pid = _entry(home, path)["pid"]
            os.kill(pid, signal.SIGKILL)

            def replaced(path: tuple[str, ...] = path, pid: int = pid) -> bool:
                return _entry(home, path).get("pid") not in (None, pid) and _status(cli)[0] == 0

            wait_until_sync(replaced, f"a new {'/'.join(path)} after SIGKILL", 60, interval_s=0.1)
    finally:
        cli("down")


def _component(doc: dict, name: str) -> dict | None:
    return next((c for c in doc["components"] if c["name"] == name), None)


def _entry(home: Path, path: tuple[str, ...]) -> dict:
    entry = read_state(home)
    for key in path:
        entry = entry[key]
    return entry


def test_up_fails_clearly_when_a_service_never_comes_up(stack_home: Path) -> None:
    home = stack_home
    cli = Cli(home=home, env=stack_env(home, services="always_crash"))
    result = cli("up", "--timeout", "10")
    assert result.returncode == 1
    assert "not healthy after 10s" in result.stderr
    log_path = home / "logs" / "always_crash.log"
    assert "always_crash" in result.stderr and str(log_path) in result.stderr
    assert "Traceback" not in result.stderr
    assert log_path.exists()
    # It stopped what it had started.
    assert read_state(home)["phase"] in ("stopped", "failed")
    code, _ = _status(cli)
    assert code == 1


def test_up_fails_at_once_naming_a_setting_a_service_refuses(stack_home: Path) -> None:
    # A mistyped setting made every service exit at start with the same one-line error: `up`
    # used to wait out its whole timeout, then point at the logs without saying why.
    home = stack_home
    env = stack_env(home, services="env-registry") | {"ROLLOUT_WRITES_PER_KEY": "lots"}
    started = time.monotonic()
    result = Cli(home=home, env=env)("up", "--timeout", "240")
    took = time.monotonic() - started
    assert result.returncode == 1
    assert (
        "env-registry cannot start: ROLLOUT_WRITES_PER_KEY must be a number of requests a "
        "second, got 'lots'" in result.stderr
    ), result.stderr
    assert "Traceback" not in result.stderr
    assert took < 120, took  # well before the timeout (it was 120 s by default): no waiting
    assert read_state(home)["phase"] in ("stopped", "failed")


def test_a_second_up_that_times_out_leaves_the_starting_stack_and_says_so(
    stack_home: Path,
) -> None:
    # A second `up` while the first one's stack is still starting waits for it. When it gives
    # up it stops nothing (that stack is the first `up`'s), so it must not say it stopped it.
    home = stack_home
    cli = Cli(home=home, env=stack_env(home, services="always_crash"))
    first = subprocess.Popen(
        cli_command("up", "--timeout", "120"),
        env=cli.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_sync(
            lambda: read_state(home).get("phase") == "starting", "the first up's stack", 60
        )
        second = cli("up", "--timeout", "2")
        assert second.returncode == 1
        assert "stopped it" not in second.stderr, second.stderr
        assert "still starting" in second.stderr and "rollout down" in second.stderr, second.stderr
        assert read_state(home)["supervisor"].get("pid"), "the second up stopped the first's"
    finally:
        cli("down")
        first.wait(timeout=60)


@pytest.mark.parametrize("setting", ["ROLLOUT_NATS_PORT", "ROLLOUT_PG_PORT"])
def test_up_on_a_port_another_process_holds_names_the_port_and_its_setting(
    stack_home: Path, setting: str
) -> None:
    # It said "nats-server rollout did not start: exited with code 1" over 15 lines of the
    # server's banner, the cause on the last one.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = stack_env(stack_home) | {setting: str(port)}
        result = Cli(home=stack_home, env=env)("up", "--timeout", "60")
    assert result.returncode == 1
    first = result.stderr.splitlines()[0]
    assert f"port {port} is in use by another process" in first, result.stderr
    assert f"set {setting} to another port" in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) <= 5, result.stderr
    assert not read_state(stack_home).get("supervisor", {}).get("pid")


def test_up_rejects_an_unknown_service(stack_home: Path) -> None:
    home = stack_home
    env = stack_env(home, services="nope")
    result = Cli(home=home, env=env)("up")
    assert result.returncode == 1
    assert "ROLLOUT_SERVICES: unknown service(s) nope" in result.stderr
    assert "Traceback" not in result.stderr


def test_foreground_stops_everything_on_ctrl_c(stack_home: Path) -> None:
    home = stack_home
    env = stack_env(home)
    proc = subprocess.Popen(
        cli_command("up", "--foreground"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            return read_state(home).get("phase") == "ready"

        wait_until_sync(ready, "`up --foreground` to be ready", 60)
        state = read_state(home)
        pids = [state["nats"]["pid"], state["postgres"]["pid"], state["services"]["idle"]["pid"]]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        for pid in pids:
            assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), pid
        assert read_state(home)["phase"] == "stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_external_urls_start_no_servers(
    stack_home: Path, nats_server: NatsServer, pg_dsn: str, clean_jetstream: None
) -> None:
    home = stack_home
    env = stack_env(home) | {
        "ROLLOUT_NATS_URL": nats_server.url,
        "ROLLOUT_NATS_USER": nats_server.user,
        "ROLLOUT_NATS_PASSWORD": nats_server.password,
        "ROLLOUT_DATABASE_URL": pg_dsn,
    }
    cli = Cli(home=home, env=env)
    try:
        _up(cli)
        state = read_state(home)
        assert state["nats"] == {"external": True, "url": nats_server.url}
        assert state["postgres"]["external"] is True and "pid" not in state["postgres"]
        assert not (home / "nats").exists() and not (home / "postgres").exists()
        assert "password" not in json.dumps(state["postgres"]).lower()
        doc = _healthy_status(cli)
        assert {c["name"]: c["external"] for c in doc["components"]} == {
            "nats": True,
            "postgres": True,
            "idle": False,
        }
    finally:
        cli("down")
    # The external servers are not ours to stop.
    assert nats_server.healthy()
    client = await nats.connect(
        nats_server.url, user=nats_server.user, password=nats_server.password
    )
    await client.close()


def test_wrong_external_credentials_fail_up_clearly(
    stack_home: Path, nats_server: NatsServer, pg_dsn: str
) -> None:
    home = stack_home
    env = stack_env(home) | {
        "ROLLOUT_NATS_URL": nats_server.url,
        "ROLLOUT_NATS_USER": nats_server.user,
        "ROLLOUT_NATS_PASSWORD": "wrong",
        "ROLLOUT_DATABASE_URL": pg_dsn,
    }
    cli = Cli(home=home, env=env)
    try:
        result = cli("up", "--timeout", "30")
        assert result.returncode == 1
        assert "refused the connection" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        cli("down")


@pytest.mark.slow
def test_up_runs_the_registered_services_by_default(stack_home: Path) -> None:
    home = stack_home
    env = stack_env(home)
    del env["ROLLOUT_SERVICES"], env["ROLLOUT_EXTRA_SERVICES"]
    cli = Cli(home=home, env=env)
    try:
        _up(cli)
        doc = _healthy_status(cli)
        names = {c["name"] for c in doc["components"]}
        assert {"nats", "postgres", "tracker"} <= names
    finally:
        cli("down")


@pytest.mark.slow
def test_up_after_a_killed_supervisor_replaces_its_orphans(cli: Cli) -> None:
    _up(cli)
    before = read_state(cli.home)
    os.kill(before["supervisor"]["pid"], signal.SIGKILL)
    orphans = [before["nats"]["pid"], before["postgres"]["pid"], before["services"]["idle"]["pid"]]
    _up(cli)
    after = read_state(cli.home)
    assert after["nats"]["pid"] not in orphans
    assert all(not _alive(pid) for pid in orphans)
    _healthy_status(cli)
    os.kill(after["supervisor"]["pid"], signal.SIGKILL)
    # `down` without a supervisor still stops what the state file names.
    result = cli("down")
    assert "nats" in result.stdout and "idle" in result.stdout
    assert not _alive(after["nats"]["pid"]) and not _alive(after["postgres"]["pid"])


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and not _is_zombie(pid)
