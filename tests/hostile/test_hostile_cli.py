"""Bad flags and a reader that goes away: a clear error and an exit status, never a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.shared.stack.nats import service_password_variable
from rollout.shared.stack.services import SERVICES

ROOT = Path(__file__).resolve().parents[2]
REFUND = ROOT / "examples" / "refund_agent.py"


def rollout(*args: str, **kwargs) -> subprocess.CompletedProcess:  # noqa: ANN003
    """The real CLI in a child process."""
    return subprocess.run([sys.executable, "-m", "rollout.cli", *args], capture_output=True,
                          text=True, timeout=120, **kwargs)  # fmt: skip


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_env_serve_refuses_a_port_that_is_not_one(port: str) -> None:
    done = rollout("env", "serve", str(REFUND), "--port", port)
    assert done.returncode == 2
    assert "argument --port" in done.stderr and "Traceback" not in done.stderr


def test_env_serve_names_a_host_it_cannot_listen_on() -> None:
    done = rollout("env", "serve", str(REFUND), "--host", "999.1.1.1", "--port", "0")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "cannot listen on 999.1.1.1:0" in done.stderr and "--host" in done.stderr


def test_env_serve_names_a_taken_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        done = rollout("env", "serve", str(REFUND), "--port", port)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr


def test_export_verifiers_refuses_an_out_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "existing.py"
    target.write_text("keep me\n")
    done = rollout("env", "export-verifiers", str(REFUND), "-o", str(target))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "exists and is not a folder" in done.stderr
    assert target.read_text() == "keep me\n"


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    read, write = os.pipe()
    os.close(read)  # every write to stdout now fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "rollout.cli", "plan", str(REFUND), "--json"],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_what_the_cli_prints_is_shown_never_obeyed(tmp_path: Path) -> None:
    # A name holding a window-title (OSC), clear-screen and colour sequence and a bidi override:
    # printed back in an error, each control character is written out, none reaches the terminal.
    hostile = "run\x1b]0;OWNED\x07\x1b[2J\x1b[1;31mFAKE\u202eexe.py"
    done = rollout("plan", str(tmp_path / hostile))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "\\u001b]0;OWNED\\u0007\\u001b[2J\\u001b[1;31mFAKE\\u202eexe.py" in done.stderr
    assert not any(ch in done.stderr + done.stdout for ch in "\x1b\x07\u202e")


def test_shown_escapes_controls_and_keeps_text() -> None:
    from rollout.printable import shown

    assert shown("a\tb\nc") == "a\tb\nc"
    assert shown("ünïcødé ✓ 😀 日本") == "ünïcødé ✓ 😀 日本"
    assert shown("\x1b[2J\r\x9b31m\x00\u2028") == "\\u001b[2J\\u000d\\u009b31m\\u0000\\u2028"
    # Inside --json output the escapes stay JSON and decode to the same text.
    import json

    text = "babble \x85\x9b\u2028 end"
    assert json.loads(shown(json.dumps({"t": text}, ensure_ascii=False))) == {"t": text}


@pytest.mark.parametrize(
    ("field", "value"),
    [("model", "http://127.0.0.1:1/v1#s\x1b]0;T\x07"), ("name", "base\x1b[2J"),
     ("name", "two\nlines")],
)  # fmt: skip
def test_a_run_named_with_terminal_escapes_is_refused(field: str, value: str) -> None:
    from pydantic import ValidationError

    from rollout.shared.contracts.requests import CreateRun, ImportedRollout, ImportRun

    fields = {"env_slug": "refunds", "model": "local/scripted", field: value}
    with pytest.raises(ValidationError, match="must be one line, without control characters"):
        CreateRun(**fields)
    rollouts = [{"task_index": 0, "sample_index": 0, "trajectory": {}, "score": 1.0,
                 "passed": True}]  # fmt: skip
    with pytest.raises(ValidationError, match="must be one line"):
        ImportRun(env_slug="refunds", rollouts=rollouts, **{field: value})
    with pytest.raises(ValidationError, match="without control characters"):
        ImportedRollout(**rollouts[0] | {"reason": "ok\x1b[2J"})
    assert ImportedRollout(**rollouts[0] | {"reason": "line one\n\tline two"}).reason


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["refund-agent", "--model", "local/scripted", "--config", "PLAN"], "not both"),
        (["--model", "local/scripted", "--config", "PLAN"], "not both"),
        (["refund-agent", "--model", "local/scripted", "--with", "policy=x"], "needs --config"),
    ],
)
def test_run_refuses_flags_it_would_ignore(tmp_path: Path, args: list[str], said: str) -> None:
    # A plan names its own envs and models: SLUG or --model beside --config were ignored, the
    # plan run as if they were not there (and --with without a plan likewise).
    plan = ROOT / "examples" / "local-grpo.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
    env["ROLLOUT_HOME"] = str(tmp_path)  # no stack: nothing must get as far as asking one
    done = rollout("run", *[str(plan) if a == "PLAN" else a for a in args], env=env)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_every_commands_help_renders() -> None:
    # argparse formats help lazily: a bare `%` in one option's help is a traceback on --help.
    import argparse

    from rollout.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, str]]:
        found = [(path, parser.format_help())]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += walk(sub, f"{path} {name}")
        return found

    helps = walk(build_parser(), "rollout")
    assert len(helps) > 30 and all(text for _, text in helps)
    compare = dict(helps)["rollout compare"]
    assert "over 50% of a run's rollouts errored" in " ".join(compare.split())


def test_the_clis_own_progress_lines_still_redraw(capsys) -> None:
    import sys

    from rollout import printable

    printable.install()
    try:
        printable.redraw("  [##..] 2/4 scored \x1b[2J")
        print("a name \x1b]0;T\x07", file=sys.stderr)
    finally:
        sys.stderr = printable.raw_stderr()
        sys.stdout = getattr(sys.stdout, "raw", sys.stdout)
    err = capsys.readouterr().err
    # Our carriage return moves the cursor; escapes in what is shown never do.
    assert err == "\r  [##..] 2/4 scored \\u001b[2Ja name \\u001b]0;T\\u0007\n", repr(err)


def test_push_refuses_two_environments_of_one_slug_as_plan_does(tmp_path: Path) -> None:
    two = tmp_path / "two.py"
    two.write_text(
        "from rollout import Environment, Task\n"
        "a = Environment(slug='dup', template='custom', tasks=[Task(instruction='x')])\n"
        "b = Environment(slug='dup', template='custom', tasks=[Task(instruction='y')])\n"
    )
    for verb in ("plan", "push"):
        done = rollout(verb, str(two))
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert "'dup' is used by 2 environments" in done.stdout + done.stderr, verb


def test_an_audit_whose_policies_do_not_apply_is_no_clean_pass() -> None:
    done = rollout("audit", str(REFUND), "--policy", "sql_literal_guess")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "--policy sql_literal_guess: does not apply to 'refund-agent' (workflow" in done.stderr
    assert "no task hackable" not in done.stdout


def test_schemas_export_refuses_a_dir_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("keep me\n")
    for extra in ([], ["--check"]):
        done = rollout("schemas", "export", "--dir", str(target), *extra)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"--dir {target}: is a file, not a folder" in done.stderr
    assert target.read_text() == "keep me\n"


def test_schemas_export_refuses_an_asyncapi_that_is_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "api"
    folder.mkdir()
    schemas = tmp_path / "schemas"
    done = rollout("schemas", "export", "--dir", str(schemas), "--asyncapi", str(folder))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"--asyncapi {folder}: is a folder" in done.stderr
    assert not schemas.exists()  # refused before anything was written


def test_schemas_export_into_a_folder_keeps_json_it_did_not_write(tmp_path: Path) -> None:
    # Every *.json no model produced was deleted, a user's own data files included.
    folder = tmp_path / "mine"
    (folder / "events").mkdir(parents=True)
    own = {
        folder / "config.json": '{"lr": 0.1}\n',
        folder / "events" / "notes.json": '["not a schema"]\n',
        folder / "events" / "my_event.json": '{"title": "Mine", "data": 1}\n',
    }
    for path, text in own.items():
        path.write_text(text)
    # A schema an earlier export wrote for an event that no longer exists goes.
    stale = folder / "events" / "run.renamed.json"
    stale.write_text('{"title": "Old", "type": "object", "properties": {}}\n')
    done = rollout(
        "schemas", "export", "--dir", str(folder), "--asyncapi", str(tmp_path / "a.json")
    )
    assert done.returncode == 0, done.stderr
    assert all(path.read_text() == text for path, text in own.items())
    assert not stale.exists() and (folder / "events" / "run.started.json").is_file()


def test_nats_config_keeps_a_file_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "nats.conf"
    out.write_text("# my own server config\n")
    done = rollout("admin", "nats-config", "--terraform-template", "--out", str(out))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"--out {out}: exists and is not an earlier `rollout admin nats-config`" in done.stderr
    assert out.read_text() == "# my own server config\n"


def test_nats_config_replaces_its_own_earlier_file(tmp_path: Path) -> None:
    out = tmp_path / "nats.conf"
    variables = ["ROLLOUT_NATS_PASSWORD", *map(service_password_variable, SERVICES)]
    passwords = {name: f"pw-{i}" for i, name in enumerate(variables)}
    env = {**os.environ, **passwords}
    for flags in (["--terraform-template"], [], []):
        done = rollout("admin", "nats-config", *flags, "--out", str(out), env=env)
        assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("listen: 0.0.0.0:4222\n")


def test_verbs_after_rollout_down_say_the_stack_is_not_running(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    home = tmp_path / "home"
    home.mkdir()
    # What `rollout down` leaves: the stopped stack's state file, its NATS address in it.
    state = {
        "phase": "stopped",
        "nats": {"url": f"nats://127.0.0.1:{port}", "external": False},
        "postgres": {"url": f"postgresql://rollout:x@127.0.0.1:{port}/rollout", "external": False},
    }
    (home / "state.json").write_text(json.dumps(state))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
    env["ROLLOUT_HOME"] = str(home)
    for args in (["runs"], ["push", str(REFUND)], ["ui", "--port", "0"]):
        done = rollout(*args, env=env)
        assert done.returncode == 1 and "Traceback" not in done.stderr, (args, done.stderr)
        assert "the local stack is not running" in done.stderr, (args, done.stderr)
        assert "start it with `rollout up`" in done.stderr and "--endpoint" not in done.stderr


@pytest.mark.parametrize("protocol", ["openenv", "nemo-gym"])
async def test_env_serve_says_the_url_it_listens_on(protocol: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rollout.cli", "env", "serve", str(REFUND), "--port", "0",
        "--protocol", protocol, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith(f"serving refund-agent ({protocol}) on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].split()[0]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        # Said once it listens: a connection to that address is accepted at once.
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    finally:
        proc.terminate()
        await proc.wait()
