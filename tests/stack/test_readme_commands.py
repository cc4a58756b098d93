"""Every command README.md documents runs, as the `rollout` CLI, on a real embedded stack.

The commands are read from README.md's ```bash blocks; each has a runner here (a documented
command without one fails `test_every_documented_command_has_a_runner`). The runner takes the
command as written, or a fast variant of it on the same code path: a tiny transformers model
(`hf:DIR`, built in seconds) where the README names a model that takes minutes to prepare or a
remote API, fewer steps, the ids the earlier commands created for RUN, JOB and the like.
`openai/gpt-4o-mini` is served by a local HTTP server (`OPENAI_BASE_URL`: the only fake).
The stack is the one `rollout demo` starts when none runs (then `rollout up` finds it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fakes.openai_server import FakeOpenAI, Reply, text_reply, tool_reply

from rollout.shared.stack.supervisor import cli_command, down

from .conftest import stack_env

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def documented_commands() -> list[str]:
    """Every command line of README.md's bash blocks, in order, inline comments removed."""
    out: list[str] = []
    inside = False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            inside = False if inside else line.strip() == "```bash"
            continue
        text = re.split(r"\s{2,}#|^#", line)[0].strip()
        if inside and text:
            out.append(text)
    return out


def readme_env_file() -> str:
    """The README's `refund_agent.py` (its python block that starts with that name)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    [block] = [b for b in blocks if b.startswith("# refund_agent.py")]
    return block


def refund_agent(body: dict[str, Any]) -> Reply:
    """`openai/gpt-4o-mini` for the README's env: look the order up, refund it, answer."""
    # (No other model is faked: every other model these commands use is a real one.)
    messages = body["messages"]
    if not any(m["role"] == "user" for m in messages):
        return text_reply("hello")
    user = next(m["content"] for m in messages if m["role"] == "user")
    order = re.search(r"O-\d+", user)
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if order is None or not body.get("tools"):
        return text_reply("Sure.")
    if turn == 0:
        return tool_reply(("lookup_order", {"order_id": order.group()}))
    if turn == 1:
        # Refunds too much on every fourth seed: runs have failures to learn from (KTO).
        wrong = (body.get("seed") or 0) % 4 == 0
        return tool_reply(
            ("refund", {"order_id": order.group(), "amount": 110.0 if wrong else 100.0})
        )
    return text_reply("Refunded.")


@dataclass
class Session:
    """The commands' shared state: where they run, the stack's environment, ids they made."""

    cwd: Path
    env: dict[str, str]
    tiny: str
    # The local server behind `openai/gpt-4o-mini`: a runner may hold its answers.
    model_server: FakeOpenAI
    ids: dict[str, str] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)

    def rollout(
        self, *args: str, timeout: float = 300.0, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `rollout ARGS` here; fail the test (with its output) unless it exits 0."""
        self.ran.append(" ".join(args))
        done = subprocess.run(
            cli_command(*args),
            cwd=self.cwd,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, (
            f"rollout {' '.join(args)} exited {done.returncode}\n"
            f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
        )
        return done

    def json(self, *args: str, **kw: Any) -> Any:
        """Run a command with --json and parse its document."""
        return json.loads(self.rollout(*args, "--json", **kw).stdout)

    def until(self, args: list[str], seen: Callable[[str], bool], limit_s: float = 120.0) -> str:
        """Start a long-running command, read its output until `seen(line)`, stop it."""
        self.ran.append(" ".join(args))
        proc = subprocess.Popen(
            cli_command(*args),
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: list[str] = []
        deadline = time.monotonic() + limit_s
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if seen(line):
                    return "".join(lines)
                if time.monotonic() > deadline:
                    break
            raise AssertionError(f"rollout {' '.join(args)}: never printed it\n{''.join(lines)}")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def latest_run(s: Session, slug: str) -> str:
    runs = s.json("runs")["runs"]
    return next(r["runId"] for r in runs if r["envSlug"] == slug)


# --- one runner per documented command -------------------------------------------------------


def quick_start(s: Session) -> None:
    # `python3 -m venv .venv && . .venv/bin/activate && pip install ...` is what .ci/run does
    # before this test runs; here: the demo with no stack running (it starts one), then `up`.
    # The demo's 6 SFT steps leave the tiny model babbling (near-uniform tokens), so a GRPO
    # sample scores 1/6 (no tool call: only `no_errors` passes) unless the atomic <tool_call>
    # token turns up by chance (a malformed call: 0), in about 6% of samples. A round's 4 tasks
    # x 2 samples were all flat 70% of the time (30 of 43), and 8 flat rounds in a row fail the
    # job (~6% of tests); with 8 samples a task 10% (4 of 39 rounds), 8 in a row ~1e-6 at worst.
    doc = s.json(
        "demo", "--model", s.tiny, "--env", "support-refunds", "--steps", "1",
        "--group-size", "8", timeout=900,
    )  # fmt: skip
    assert [st["stage"] for st in doc["stages"]] == ["baseline", "train", "sft", "grpo"]
    assert doc["stages"][0]["endedBy"] and doc["compare"]["base"]["runId"]
    up = s.rollout("up")
    assert "healthy" in up.stdout


def ci_run(s: Session) -> None:
    # This test runs inside it: check it is the entry point the README says.
    script = ROOT / ".ci" / "run"
    assert os.access(script, os.X_OK) and "pytest" in script.read_text()


def plan_env(s: Session) -> None:
    (s.cwd / "refund_agent.py").write_text(readme_env_file())
    s.rollout("plan", "refund_agent.py")


def local_test(s: Session) -> None:
    out = s.rollout("test", "refund_agent.py", "--model", "openai/gpt-4o-mini", "--task", "0")
    assert "pass" in out.stdout.lower()


def audit_local(s: Session) -> None:
    out = s.rollout("audit", "refund_agent.py").stdout
    assert "refund-agent (workflow): 1 task(s)" in out and "no task hackable" in out, out


def push(s: Session) -> None:
    s.rollout("push", "refund_agent.py")


def audit_platform(s: Session) -> None:
    out = s.rollout("audit", "refund-agent", "--platform").stdout
    assert "refund-agent v1 (workflow)" in out and "no task hackable" in out, out


def envs(s: Session) -> None:
    assert "refund-agent" in s.rollout("envs").stdout


def run_follow(s: Session) -> None:
    s.rollout("run", "refund-agent", "--model", "openai/gpt-4o-mini", "-n", "8", "--follow")
    s.ids["RUN"] = latest_run(s, "refund-agent")
    run = s.json("show", s.ids["RUN"])
    assert run["status"] == "completed" and run["scored"] == 8 and run["errored"] == 0, run


def runs(s: Session) -> None:
    assert s.ids["RUN"] in s.rollout("runs").stdout


def show(s: Session) -> None:
    assert s.ids["RUN"] in s.rollout("show", s.ids["RUN"]).stdout


def compare(s: Session) -> None:
    other = s.json("run", "refund-agent", "--model", "openai/gpt-4o-mini", "-n", "8", "--follow")
    s.ids["OTHER"] = other.get("runId") or latest_run(s, "refund-agent")
    s.rollout("compare", s.ids["RUN"], s.ids["OTHER"])


def events_follow(s: Session) -> None:
    s.until(["events", "--run", s.ids["RUN"], "--follow"], lambda line: "run.completed" in line)


def replay_reverify(s: Session) -> None:
    s.rollout("replay", s.ids["RUN"], "--reverify")


def improve_sft(s: Session) -> None:
    job = s.json("improve", "--run", s.ids["RUN"], "--model", s.tiny, "--method", "sft",
                 "--suffix", "v1", "--follow")  # fmt: skip
    s.ids["JOB"] = job.get("id") or job.get("jobId")


def improve_online(s: Session) -> None:
    s.json("improve", "--env", "refund-agent", "--model", s.tiny, "--method", "ppo",
           "--steps", "1", "--follow", timeout=600)  # fmt: skip


def jobs_and_job(s: Session) -> None:
    s.rollout("jobs")
    s.rollout("job", s.ids["JOB"], "--follow")


def cancel(s: Session) -> None:
    # The model holds its answers: the run is surely still going when it is cancelled.
    s.model_server.hold()
    try:
        run = s.json("run", "refund-agent", "--model", "openai/gpt-4o-mini", "-n", "8")
        out = s.rollout("cancel", run["runId"], "--reason", "wrong model").stdout
    finally:
        s.model_server.release()
    assert out.startswith(f"run {run['runId']} cancelled: wrong model (0/8 rollouts scored)"), out
    shown = s.json("show", run["runId"])
    assert shown["status"] == "failed" and shown["reason"].startswith("cancelled: wrong model")


def generate_env(s: Session) -> None:
    s.rollout("generate", "--model", "openai/gpt-4o-mini", "--env", "refund-agent", "--split",
              "train", "--out", "gen.jsonl", "-n", "4", "--score")  # fmt: skip
    assert len((s.cwd / "gen.jsonl").read_text().splitlines()) == 4


def generate_prompts(s: Session) -> None:
    (s.cwd / "prompts.jsonl").write_text('{"prompt": "Say hello."}\n')
    s.rollout("generate", "--model", "openai/gpt-4o-mini", "--prompts", "prompts.jsonl",
              "--out", "gen.parquet")  # fmt: skip
    assert (s.cwd / "gen.parquet").stat().st_size > 0


def export_runs(s: Session) -> None:
    s.rollout("export", "--run", s.ids["RUN"], "--run", s.ids["OTHER"], "--format", "hf",
              "--out", "snap")  # fmt: skip


def export_buffer(s: Session) -> None:
    s.rollout("export", "--buffer", "--env", "refund-agent", "--verdict", "passed",
              "--policy-version", "0", "--since", "2h", "--out", "snap-buffer")  # fmt: skip


def import_snapshot(s: Session) -> None:
    s.rollout("import", "snap", "-o", "sets/")
    assert (s.cwd / "sets" / "sft.jsonl").is_file()


def improve_dataset(s: Session) -> None:
    s.json("improve", "--dataset", "snap", "--model", s.tiny, "--method", "kto", "--follow")


def _fast_plan(s: Session) -> Path:
    # examples/local-grpo.toml with the tiny model and one GRPO step. The untrained tiny model
    # (not local/tiny-agent) earns reward differences only by chance, as in `quick_start`:
    # 8 samples a task so that a round without one stays rare (4 of them: 6 of 22 flat).
    folder = s.cwd / "plan"
    folder.mkdir(exist_ok=True)
    shutil.copy(ROOT / "examples" / "workflow_support.py", folder)
    text = (ROOT / "examples" / "local-grpo.toml").read_text()
    text = text.replace('policy = "local/tiny-agent"', f'policy = "{s.tiny}"')
    text = text.replace("max_steps = 2", "max_steps = 1")
    assert "group_size = 4" in text
    text = text.replace("group_size = 4", "group_size = 8")
    (folder / "local-grpo.toml").write_text(text)
    return folder / "local-grpo.toml"


def plan_plan(s: Session) -> None:
    s.json("plan", str(_fast_plan(s)))


def run_plan(s: Session) -> None:
    out = s.rollout("run", "--config", str(_fast_plan(s)), timeout=900)
    found = re.search(r"plan (\S+) started", out.stdout + out.stderr)
    assert found, out.stdout[-2000:]
    s.ids["PLAN_ID"] = found.group(1)


def plan_events(s: Session) -> None:
    s.until(["events", "--plan", s.ids["PLAN_ID"], "--follow"], lambda line: "plan." in line)


def plan_replay(s: Session) -> None:
    s.json("replay", "--plan", s.ids["PLAN_ID"])


def key_viewer(s: Session) -> None:
    made = s.rollout("keys", "create", "--role", "viewer")
    assert "rk_viewer_" in made.stdout
    assert "stack is not running" not in made.stderr, made.stderr  # applied to the server now


def key_runner(s: Session) -> None:
    made = s.rollout("keys", "create", "--role", "runner")
    assert "stack is not running" not in made.stderr, made.stderr
    s.ids["KEY"] = re.search(r"rk_runner_\S+", made.stdout).group()  # type: ignore[union-attr]


def key_limited(s: Session) -> None:
    made = s.rollout(
        "keys", "create", "--role", "runner", "--max-rollouts-per-day", "5000",
        "--max-jobs-per-day", "10", "--json",
    )  # fmt: skip
    assert json.loads(made.stdout)["limits"] == {
        "max_rollouts_per_day": 5000,
        "max_jobs_per_day": 10,
    }


def key_limit(s: Session) -> None:
    changed = s.rollout("keys", "limit", s.ids["KEY"], "--max-rollouts-per-day", "20000")
    assert "rollouts 20000 a day, jobs unlimited" in changed.stdout, changed.stdout


def keys_list(s: Session) -> None:
    key_id = s.ids["KEY"].split("_")[2]
    [row] = [line for line in s.rollout("keys", "list").stdout.splitlines() if key_id in line]
    assert " 0/20000 " in row, row


def login(s: Session) -> None:
    state = json.loads((Path(s.env["ROLLOUT_HOME"]) / "state.json").read_text())
    endpoint = state["nats"]["url"] if "url" in state["nats"] else None
    endpoint = endpoint or f"nats://127.0.0.1:{state['nats']['port']}"
    s.rollout("login", "--endpoint", endpoint, stdin=s.ids["KEY"] + "\n")


def whoami(s: Session) -> None:
    assert "runner" in s.rollout("whoami").stdout


def serve_model(s: Session) -> None:
    port = free_port()
    s.until(["serve-model", s.tiny, "--port", str(port)], lambda line: "/v1" in line)


def ui(s: Session) -> None:
    def opened(line: str) -> bool:
        found = re.search(r"open (http://\S+)", line)
        if found:
            with urllib.request.urlopen(found.group(1), timeout=30) as page:
                assert page.status == 200
        return found is not None

    s.until(["ui", "--port", str(free_port())], opened)


# README line (comments removed) -> its runner.
RUNNERS: dict[str, Callable[[Session], None]] = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install "
    "-e '.[train]' && rollout up && rollout demo": quick_start,
    ".ci/run": ci_run,
    "rollout plan refund_agent.py": plan_env,
    "rollout test refund_agent.py --model openai/gpt-4o-mini --task 0": local_test,
    "rollout audit refund_agent.py": audit_local,
    "rollout push refund_agent.py": push,
    "rollout envs": envs,
    "rollout audit refund-agent --platform": audit_platform,
    "rollout run refund-agent --model openai/gpt-4o-mini -n 8 --follow": run_follow,
    "rollout runs": runs,
    "rollout show RUN": show,
    "rollout compare BASE OTHER": compare,
    "rollout events --run RUN --follow": events_follow,
    "rollout replay RUN --reverify": replay_reverify,
    "rollout improve --run RUN --model BASE --method sft --suffix v1": improve_sft,
    "rollout improve --env SLUG --model BASE --method ppo --steps 8": improve_online,
    "rollout jobs; rollout job JOB --follow": jobs_and_job,
    'rollout cancel RUN_OR_JOB --reason "wrong model"': cancel,
    "rollout generate --model M --env refund-agent --split test --out gen.jsonl -n 4 --score": (
        generate_env
    ),
    "rollout generate --model M --prompts prompts.jsonl --out gen.parquet": generate_prompts,
    "rollout export --run RUN [--run RUN2] --format hf|parquet|jsonl --out snap": export_runs,
    "rollout export --buffer --env SLUG --verdict failed --policy-version 3 --since 2h --out snap": (
        export_buffer
    ),
    "rollout import snap -o sets/": import_snapshot,
    "rollout improve --dataset snap --model local/tiny-agent --method kto": improve_dataset,
    "rollout plan examples/local-grpo.toml [--json]": plan_plan,
    "rollout run --config examples/local-grpo.toml": run_plan,
    "rollout events --plan PLAN_ID --follow": plan_events,
    "rollout replay --plan PLAN_ID [--json]": plan_replay,
    "rollout keys create --role viewer": key_viewer,
    "rollout keys create --role runner": key_runner,
    "rollout login --endpoint nats://host:4222": login,
    "rollout whoami": whoami,
    "rollout keys create --role runner --max-rollouts-per-day 5000 --max-jobs-per-day 10": (
        key_limited
    ),
    "rollout keys limit KEY --max-rollouts-per-day 20000": key_limit,
    "rollout keys list": keys_list,
    "rollout serve-model local/tiny-agent --port 8400": serve_model,
    "rollout ui": ui,
}


def test_every_documented_command_has_a_runner() -> None:
    documented = documented_commands()
    assert len(documented) == len(set(documented))
    assert set(documented) == set(RUNNERS), {
        "without a runner": sorted(set(documented) - set(RUNNERS)),
        "no longer documented": sorted(set(RUNNERS) - set(documented)),
    }


@pytest.mark.timeout(2400)
def test_the_documented_commands_run_on_the_embedded_stack(tmp_path: Path) -> None:
    from rollout.shared.models.tiny import build_tiny_model

    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    corpus = [readme_env_file(), (ROOT / "examples" / "workflow_support.py").read_text()]
    tiny = build_tiny_model(tmp_path / "tiny", seed=0, corpus=corpus)
    env = stack_env(home)
    env.pop("ROLLOUT_SERVICES")  # every real service
    env.pop("ROLLOUT_EXTRA_SERVICES")
    env |= {"ROLLOUT_HF_THREADS": "1", "OPENAI_API_KEY": "sk-test"}
    with FakeOpenAI(refund_agent) as server:
        env["OPENAI_BASE_URL"] = server.base_url
        session = Session(cwd=work, env=env, tiny=f"hf:{tiny}", model_server=server)
        try:
            for command in documented_commands():
                RUNNERS[command](session)
        finally:
            down(home, timeout=60)
