"""`rollout --help` and the verbs' --help load no client stack, models, web or training code;
`whoami` and `status` load only what they use.

Every `rollout` command builds every verb's parser first, so whatever that imports each verb
pays for (benchmarks/cli_startup.py measures it). Each check runs in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from import_graph import CLI_STARTUP_HEAVY

# Packages that building the parser and printing help must not import: the import-floor
# check's heavy set plus what the CLI's modules defer (the NATS client and faststream, the
# database driver, the contracts' pydantic, logging, the web viewer, training).
NOT_AT_STARTUP = tuple(sorted(CLI_STARTUP_HEAVY))
# Verbs whose arguments' help comes from a heavy module: they add them when their own help
# is asked for or they run (rollout.cli._common.later), so only their --help loads it.
DEFERRED = {"audit", "cancel", "compare", "improve"}

_RUN = """
import contextlib, io, json, sys
from rollout.cli import main

for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def loaded_by(*argvs: list[str]) -> set[str]:
    """Top-level packages a fresh interpreter holds after `rollout ARGV` for each of `argvs`."""
    done = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(list(argvs))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def verbs() -> list[str]:
    """Every verb of `rollout`, as its parser lists them."""
    from rollout.cli import build_parser

    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(action.choices)


@pytest.mark.parametrize(
    "argv",
    [["--help"], [], ["no-such-verb"], ["runs", "--help"], ["up", "--help"], ["plan", "--help"]],
    ids=["help", "no-verb", "mistyped-verb", "runs-help", "up-help", "plan-help"],
)
def test_the_help_loads_nothing_heavy(argv: list[str]) -> None:
    assert sorted(loaded_by(argv) & set(NOT_AT_STARTUP)) == []


def test_no_verbs_help_loads_anything_heavy_but_the_deferred_ones() -> None:
    light = [[verb, "--help"] for verb in verbs() if verb not in DEFERRED]
    assert len(light) > 20 and DEFERRED <= set(verbs())
    # One interpreter for them all: the modules any of them loaded are still there at the end.
    assert sorted(loaded_by(*light) & set(NOT_AT_STARTUP)) == []


def test_import_rollout_alone_loads_nothing_heavy() -> None:
    # Env files start with `from rollout import Environment, Task`: the package itself is light,
    # and each name loads what it needs when it is first asked for.
    code = (
        "import json, sys, rollout\n"
        "light = sorted({m.split('.')[0] for m in sys.modules})\n"
        "from rollout import Environment, Task, RolloutError, action_tool, Client\n"
        "import rollout.helpers\n"
        "print(json.dumps([light, Environment.__name__, Task.__name__, Client.__name__,\n"
        "                  RolloutError.__module__, callable(action_tool), 'rollout.shared.envs' in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    light, *names, envs_loaded = json.loads(done.stdout)
    assert sorted(set(light) & set(NOT_AT_STARTUP)) == []
    assert names == ["Environment", "Task", "Client", "rollout.shared.errors", True]
    assert envs_loaded


def test_a_deferred_verbs_help_still_says_what_its_heavy_module_knows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rollout.cli import main

    for argv, shown in (
        (["improve", "--help"], "grpo (online GRPO)"),
        (["audit", "--help"], " policies: "),
        (["cancel", "--help"], "a job id (job-...)"),
        (["compare", "--help"], "over 50% of a run's rollouts errored"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 0
        assert shown in " ".join(capsys.readouterr().out.split()), argv


def test_a_deferred_verb_parses_its_arguments() -> None:
    from rollout.cli import build_parser

    args = build_parser().parse_args(["improve", "--model", "local/tiny-agent", "--method", "ipo"])
    assert (args.model, args.method, args.settings) == ("local/tiny-agent", "ipo", [])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["improve", "--model", "m", "--method", "no-such-method"])


# What `whoami` and `status` must not load: whoami asks the server who its key is (the NATS
# client, nothing of the services' consumer definitions); status probes the sandbox (not the
# env engine, its templates or their configs).
_LIGHT_VERBS = """
import contextlib, io, json, sys
from rollout.cli import main

with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""


def modules_after(argv: list[str], tmp_path: Path) -> set[str]:
    """Every module a fresh interpreter holds after `rollout ARGV`, with no stack or login."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
    # A fresh home and config folder: no stack runs there, no key is saved (fails fast).
    env.update(ROLLOUT_HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    done = subprocess.run(
        [sys.executable, "-c", _LIGHT_VERBS, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def test_whoami_loads_no_service_consumer_definitions(tmp_path: Path) -> None:
    loaded = modules_after(["whoami"], tmp_path)
    assert "nats" in loaded  # it did get as far as connecting
    heavy = {m.split(".")[0] for m in loaded} & {"faststream", "asyncpg", "httpx", "starlette"}
    assert sorted(heavy) == []
    assert "rollout.shared.service.durables" not in loaded


def test_status_probes_the_sandbox_without_the_env_engine(tmp_path: Path) -> None:
    loaded = modules_after(["status"], tmp_path)
    assert "rollout.shared.envs.sandbox_check" in loaded  # it did probe
    engine = sorted(
        m
        for m in loaded
        if m.startswith(("rollout.shared.envs.templates", "rollout.shared.envs.verifiers"))
        or m in ("rollout.shared.envs.engine", "rollout.shared.envs.validation")
    )
    assert engine == []
