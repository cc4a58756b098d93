"""`rollout generate` through the real CLI (a subprocess) against in-process services on real
NATS + Postgres: env splits and prompts files, scored or not, JSONL and Parquet outputs that
`datasets.load_dataset` opens, exactly-once rows after a SIGKILL and a re-run, and one
generate at a time per --out (a second is refused while the first writes)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import datasets
import pytest
from fakes.openai_server import FakeOpenAI, Reply, text_reply
from pipeline.kit import refund_env
from pydantic import ValidationError
from test_cli_platform import rollout
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.generate import GenerateRequest, out_lock, read_prompts, write_parquet, written_ids
from rollout.shared.contracts.envspec import TaskSpec
from rollout.shared.settings import Settings


def _cli_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "ROLLOUT_HOME": str(settings.home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": settings.nats_password or "",
    }


def _write_json(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document))


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


async def test_generate_an_env_split_scored_to_jsonl(client, agent_server, settings, tmp_path):
    await client.push_environment(refund_env(tasks=3))
    out = tmp_path / "gen.jsonl"
    model = f"{agent_server.base_url}#m"
    args = ("generate", "--env", "refunds", "--split", "train", "--model", model, "-n", "3",
            "--score", "--batch-size", "2", "--seed", "1", "--out", str(out))  # fmt: skip
    code, stdout, err = await rollout(settings, *args)
    assert code == 0, err
    assert "6 rows" in stdout and "Traceback" not in err

    rows = datasets.load_dataset("json", data_files=str(out), split="train")
    assert rows.num_rows == 6  # the 2 train tasks (task 0 is the test split) x 3 samples
    assert sorted(set(rows["task_index"])) == [1, 2]
    assert len(set(rows["rollout_id"])) == 6 and len(set(rows["run_id"])) == 1
    run = await client.get_run(rows["run_id"][0], include_rollouts=True)
    verdicts = {r["rolloutId"]: r for r in run["rollouts"]}
    for row in rows:
        assert row["score"] == verdicts[row["rollout_id"]]["score"]
        assert row["passed"] == verdicts[row["rollout_id"]]["passed"]
        assert row["env_slug"] == "refunds" and row["env_hash"] == run["envHash"]
        assert row["policy_version"] == 0 and row["prompt"].startswith("Refund order O-")
        assert json.loads(row["messages"])[-1]["content"] == "refunded"
    assert any(not p for p in rows["passed"])  # seeds divisible by 4 refund one too much

    # The same command again: already complete, nothing written twice, no second run.
    code, stdout, err = await rollout(settings, *args)
    assert code == 0, err
    assert len(_lines(out)) == 6
    assert len(await client.list_runs()) == 1

    # Other options on the same --out are refused, naming the file.
    code, _, err = await rollout(settings, *args[:-2], "-n", "1", "--out", str(out))
    assert code == 1 and f"--out {out}: was started by another generate" in err


async def test_a_start_the_tracker_refused_leaves_nothing_in_the_way(
    client, agent_server, settings, tmp_path
) -> None:
    await client.push_environment(refund_env(tasks=3))
    out = tmp_path / "new" / "folder" / "gen.jsonl"  # its folder is made
    base = ("generate", "--env", "refunds", "--model", f"{agent_server.base_url}#m",
            "--out", str(out))  # fmt: skip
    code, _, err = await rollout(settings, *base, "--split", "nope")
    assert code == 1 and "no tasks in split 'nope'" in err and "Traceback" not in err
    # The corrected command starts (no run was made: nothing to resume, nothing refused).
    code, stdout, err = await rollout(settings, *base, "--split", "train")
    assert code == 0, err
    assert "2 rows" in stdout and len(_lines(out)) == 2
    # A start that was not refused but left no run id (its answer lost: the run may exist) is
    # not thrown away by a command with other options.
    lost = tmp_path / "lost.jsonl"
    _write_json(Path(f"{lost}.generate.json"), {"params": {"model": "x"}, "client_request_id": "c"})
    code, _, err = await rollout(settings, *base[:-1], str(lost), "--split", "train")
    assert code == 1 and "was started by another generate" in err


def test_a_start_that_never_reached_nats_leaves_nothing_in_the_way(
    tmp_path, capsys, monkeypatch
) -> None:
    from rollout.cli import main

    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ROLLOUT_NATS_URL", f"nats://127.0.0.1:{port}")
    out = tmp_path / "gen.jsonl"
    base = ["generate", "--env", "refunds", "--model", "local/scripted", "--out", str(out)]
    assert main([*base, "-n", "2"]) == 1
    assert "cannot reach NATS" in capsys.readouterr().err
    # No run can exist, so the corrected command is not "started by another generate": it
    # starts over (and here meets the same missing server).
    assert main([*base, "-n", "3"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach NATS" in err and "another generate" not in err
    state = json.loads(Path(f"{out}.generate.json").read_text())
    assert state["params"]["n"] == 3 and state["refused"] is True
    # A start whose answer was lost may have made its run: meeting no NATS on the resume
    # does not make it a start that made none.
    lost = {k: v for k, v in state.items() if k != "refused"}
    Path(f"{out}.generate.json").write_text(json.dumps(lost))
    assert main([*base, "-n", "3"]) == 1
    assert "cannot reach NATS" in capsys.readouterr().err
    assert json.loads(Path(f"{out}.generate.json").read_text()) == lost


def test_out_of_range_options_are_refused_before_anything_is_written(tmp_path, capsys) -> None:
    from rollout.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    out = tmp_path / "sub" / "o.jsonl"
    code = main(["generate", "--model", "local/scripted", "--prompts", str(prompts),
                 "--out", str(out), "--temperature", "99", "--batch-size", "0",
                 "--deadline", "-1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    for flag in ("--temperature: must be between 0 and 2", "--batch-size: must be between",
                 "--deadline: must be a positive number"):  # fmt: skip
        assert flag in err
    assert not (tmp_path / "sub").exists()  # no folder, no state file
    # 11 prompts x 10,000 samples: over one run's 100,000 rollouts, said before any push.
    prompts.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(11)))
    code = main(["generate", "--model", "local/scripted", "--prompts", str(prompts),
                 "--out", str(out), "-n", "10000"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "-n: 11 task(s) x 10000 = 110,000 rollouts, over the 100,000" in err
    assert not (tmp_path / "sub").exists()


def _echo(delay: float):
    def answer(body: dict) -> Reply:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        reply = text_reply(f"echo: {user}")
        reply.delay = delay
        return reply

    return answer


@pytest.fixture
def slow_agent() -> Iterator[FakeOpenAI]:
    """Answers every prompt with its own words, slowly (so a kill lands mid-run)."""
    with FakeOpenAI(_echo(0.4)) as server:
        yield server


async def test_generate_prompts_with_answers_scores_them(client, settings, tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    # Numbers: the reply's last number is the answer ("echo: say 7" answers 7, not 9).
    rows = [{"prompt": "say 7", "answer": "7"}, {"prompt": "say 8", "answer": "9"}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scored.jsonl"
    with FakeOpenAI(_echo(0.0)) as agent:
        base = ("generate", "--prompts", str(prompts), "--model", f"{agent.base_url}#m")
        code, stdout, err = await rollout(settings, *base, "--score", "--out", str(out), "--json")
    assert code == 0, err
    assert json.loads(stdout)["rows"] == 2
    got = datasets.load_dataset("json", data_files=str(out), split="train")
    assert {r["id"]: r["passed"] for r in got} == {"0": True, "1": False}
    assert json.loads(got[0]["primitives"])[0]["type"] == "final_answer_match"

    prompts.write_text(json.dumps({"prompt": "say 7"}) + "\n")
    code, _, err = await rollout(settings, *base, "--score", "--out", str(tmp_path / "x.jsonl"))
    assert code == 1 and "have no 'answer' to score against" in err
    code, _, err = await rollout(settings, *base, "--out", str(tmp_path / "x.csv"))
    assert code == 1 and "unknown format '.csv'" in err and "Traceback" not in err


async def test_prompts_without_answers_are_said_unscored_and_show_no_pass_rate(
    client, platform, settings, tmp_path
) -> None:
    # Their env's one check (no_tool_errors, no tools) passes any reply: `rollout show` and
    # `runs` printed "pass rate 100.0% [44%, 100%]" for a run that scored nothing.
    platform.start("buffer")  # `export --buffer` reads the passed rollouts from it
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(3)))
    answered = tmp_path / "answered.jsonl"
    rows = [{"prompt": "say 7", "answer": "7"}, {"prompt": "say 8", "answer": "9"}]
    answered.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with FakeOpenAI(_echo(0.0)) as agent:
        model = f"{agent.base_url}#m"
        code, stdout, err = await rollout(
            settings, "generate", "--prompts", str(prompts), "--model", model,
            "--out", str(tmp_path / "a.jsonl"),
        )  # fmt: skip
        assert code == 0, err
        assert "3 rows" in stdout and "nothing was scored: no prompt carries an 'answer'" in stdout
        unscored = stdout.split()[1]
        code, stdout, err = await rollout(
            settings, "generate", "--prompts", str(prompts), "--model", model,
            "--out", str(tmp_path / "b.jsonl"), "--json",
        )  # fmt: skip
        assert code == 0, err
        assert json.loads(stdout)["noVerdict"].startswith("nothing was scored")
        code, stdout, err = await rollout(
            settings, "generate", "--prompts", str(answered), "--model", model,
            "--out", str(tmp_path / "c.jsonl"), "--json",
        )  # fmt: skip
        assert code == 0, err
        scored = json.loads(stdout)
        assert scored["noVerdict"] is None

    code, stdout, err = await rollout(settings, "show", unscored)
    assert code == 0, err
    assert "passed -  failed -  errored 0  pass rate -  mean score -" in stdout
    assert "100" not in stdout
    assert "no pass rate: nothing was scored: no prompt carries an 'answer'" in stdout
    code, stdout, err = await rollout(settings, "show", unscored, "--json")
    shown = json.loads(stdout)
    assert shown["passRate"] is None and shown["noVerdict"].startswith("nothing was scored")
    # Rows that carry answers are scored as before: 1 of 2 passed.
    code, stdout, err = await rollout(settings, "show", scored["runId"])
    assert code == 0 and "pass rate 50.0%" in stdout and "no pass rate" not in stdout, err

    code, stdout, err = await rollout(settings, "runs")
    assert code == 0, err
    lines = {line.split()[0]: line for line in stdout.splitlines()[1:] if line.strip()}
    assert "100%" not in lines[unscored] and " - " in lines[unscored]
    assert "50%" in lines[scored["runId"]]
    assert "(PASS -: nothing was scored" in stdout

    code, stdout, err = await rollout(settings, "compare", scored["runId"], unscored)
    assert code == 1 and "100%" not in stdout
    assert f"not comparable: other {unscored}: nothing was scored" in err

    # Exporting the buffer's "passed" rollouts, or training on a run's, says that those of
    # the unanswered prompts' env passed nothing but the absence of a tool error.
    code, stdout, err = await rollout(settings, "show", scored["runId"], "--json")
    answered_run = json.loads(stdout)
    unjudged = f"{shown['envSlug']}@{shown['envVersion']}"
    answered_env = f"{answered_run['envSlug']}@{answered_run['envVersion']}"
    note = f"{unjudged}, whose env judges nothing (nothing was scored"
    out = tmp_path / "passed.jsonl"
    code, stdout, err = await rollout(
        settings, "export", "--buffer", "--verdict", "passed", "--out", str(out), "--json"
    )
    assert code == 0, err
    assert json.loads(stdout)["judgesNothing"] == [unjudged]
    assert err.startswith("note: the exported rollouts of ") and note in err, err
    assert '"passed" means only that the reply ended without a tool error' in err
    assert answered_env not in err
    code, stdout, err = await rollout(
        settings, "export", "--buffer", "--verdict", "passed", "--env", answered_run["envSlug"],
        "--out", str(tmp_path / "answered-passed.jsonl"), "--json",
    )  # fmt: skip
    assert code == 0 and "judges nothing" not in err, err
    assert json.loads(stdout)["judgesNothing"] == []
    # No learner here: the job is refused, after the note.
    code, _, err = await rollout(settings, "improve", "--run", unscored, "--model", "m")
    assert code == 1 and f"run {unscored} of {note}" in err, err
    code, _, err = await rollout(settings, "improve", "--run", scored["runId"], "--model", "m")
    assert code == 1 and "judges nothing" not in err, err


def test_only_an_env_whose_one_check_passes_any_reply_judges_nothing() -> None:
    from rollout.generate import judges_nothing, prompts_environment

    unanswered = prompts_environment([{"instruction": "hi", "id": "0"}])
    answered = prompts_environment(
        [{"instruction": "hi", "id": "0", "hiddenGroundTruth": {"answer": "yo"}}]
    )
    assert judges_nothing(unanswered) and not judges_nothing(answered)
    # With a tool, no_tool_errors checks something: its verdicts count.
    tool = {"name": "lookup", "response": "ok"}
    assert not judges_nothing({**unanswered, "config": {"tools": [tool]}})
    assert not judges_nothing(refund_env(tasks=1))


async def test_generate_prompts_resumes_after_sigkill_exactly_once(
    client, slow_agent, settings, tmp_path
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"id": f"p{i}", "prompt": f"say {i}"}) for i in range(10)]
    lines[3] = json.dumps({"id": "p3", "messages": [{"role": "user", "content": "say 3"}]})
    prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "gen.parquet"
    partial = tmp_path / "gen.parquet.partial.jsonl"
    args = [sys.executable, "-m", "rollout.cli", "generate", "--prompts", str(prompts),
            "--model", f"{slow_agent.base_url}#m", "-n", "2", "--batch-size", "1",
            "--out", str(out)]  # fmt: skip

    proc = await asyncio.create_subprocess_exec(
        *args, env=_cli_env(settings), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip

    async def first_row() -> bool:
        assert proc.returncode is None, (await proc.stderr.read()).decode()
        return bool(_lines(partial))

    # The first row is durable: kill it now.
    await wait_until(first_row, "a first row written", 90, interval_s=0.02)
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    killed_at = _lines(partial)
    assert 0 < len(killed_at) < 20 and not out.exists()
    # Its lock file stays behind, naming a dead pid; the lock itself died with the process.
    lock = tmp_path / "gen.parquet.generate.lock"
    assert lock.read_text().strip() == str(proc.pid)
    # A kill in the middle of a write leaves a torn line: the resume must drop it.
    with partial.open("a") as f:
        f.write('{"rollout_id": "torn-')

    code, stdout, err = await rollout(settings, *args[3:])
    assert code == 0, err
    assert "resumed" in stdout and not partial.exists() and not lock.exists()
    rows = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert rows.num_rows == 20 and len(set(rows["rollout_id"])) == 20  # exactly once
    assert set(killed_at[0]) <= set(rows.column_names)
    assert {r["rollout_id"] for r in killed_at} <= set(rows["rollout_id"])
    assert sorted(rows["id"]) == sorted(f"p{i}" for i in range(10) for _ in range(2))
    assert all(r["completion"] == f"echo: say {r['id'][1:]}" for r in rows)
    assert "score" not in rows.column_names  # no --score: verdicts are not written out
    assert len({r["runId"] for r in await client.list_runs()}) == 1  # one run, resumed


@pytest.mark.parametrize(("signal_name", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
async def test_generate_stopped_by_ctrl_c_or_sigterm_says_how_far_it_got_and_resumes(
    client, slow_agent, settings, tmp_path, signal_name, code
) -> None:
    # Both used to end it without a word (SIGTERM: `timeout`, a batch scheduler, `kill`).
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(12)))
    out = tmp_path / "gen.jsonl"
    args = [sys.executable, "-m", "rollout.cli", "generate", "--prompts", str(prompts),
            "--model", f"{slow_agent.base_url}#m", "--batch-size", "1", "--out", str(out)]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *args, env=_cli_env(settings), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip

    async def first_row() -> bool:
        assert proc.returncode is None, (await proc.stderr.read()).decode()
        return bool(_lines(out))

    await wait_until(first_row, "a first row written", 90, interval_s=0.02)
    proc.send_signal(getattr(signal, signal_name))
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    err = stderr.decode()
    assert proc.returncode == code, err
    written = len(_lines(out))
    assert 0 < written < 12 and "Traceback" not in err and stdout == b""
    said = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert said == [
        f"interrupted: {written} of 12 prompts written to {out}; run the same command again to "
        "resume (the rows written are kept, and none is written twice)"
    ], err

    code, stdout, err = await rollout(settings, *args[3:])
    assert code == 0, err
    assert "12 rows" in stdout and "resumed" in stdout
    rows = _lines(out)
    assert len(rows) == 12 and len({r["rollout_id"] for r in rows}) == 12  # each exactly once


def test_an_interrupted_generate_names_its_rows_file_and_its_unit(tmp_path) -> None:
    from rollout.generate import Progress

    out = tmp_path / "gen.parquet"
    rows = tmp_path / "gen.parquet.partial.jsonl"
    rows.write_text('{"rollout_id": "a"}\n{"rollout_id": "b"}\n{"rollout_')  # a torn last line
    req = GenerateRequest(model="m", out=out, env="refunds", n=3)
    progress = Progress(req, quiet=True)
    assert progress.stopped_line().startswith(
        f"interrupted before its run started: 2 rows written to {rows} ({out} is written once "
        "all are); run the same command again to resume"
    )
    progress(2, 12, 0)
    assert progress.stopped_line().startswith(
        f"interrupted: 2 of 12 rows (4 tasks × 3) written to {rows} ({out} is written"
    )
    req = GenerateRequest(model="m", out=tmp_path / "none.jsonl", prompts=tmp_path / "p.jsonl")
    progress = Progress(req, quiet=True)
    progress(0, 5, 0)
    assert progress.stopped_line().startswith(
        f"interrupted: 0 of 5 prompts written to {tmp_path / 'none.jsonl'}; run the same"
    )


def test_bad_prompts_files_name_the_line_and_field(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    cases = {
        '{"prompt": "a"}\n{"promt": "b"}\n': f"{path}:2: unknown field(s) promt",
        '{"prompt": "a", "messages": []}\n': f"{path}:1: give exactly one of",
        '{"id": "x", "prompt": "a"}\n{"id": "x", "prompt": "b"}\n': f"{path}:2.id: 'x' repeats",
        '{"messages": [{"role": "system", "content": "s"}]}\n': f"{path}:1.messages[0]",
        "not json\n": f"{path}:1: not JSON",
        '{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n': "1 of 2 lines have an 'answer'",
        '{"prompt": "hi \\ud800"}\n': f"{path}:1: holds '\\ud800', which is not UTF-8 text",
        '{"prompt": "a", "answer": NaN}\n': f"{path}:1: holds a number that is not finite",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(RolloutError, match=None) as info:
            read_prompts(path)
        assert message in str(info.value), (text, str(info.value))


def test_a_prompts_file_with_a_bom_crlf_and_unicode_line_separators_is_read(tmp_path) -> None:
    # Line 1 of a Windows editor's file opens with a byte-order mark ("not JSON (Unexpected
    # UTF-8 BOM)"); JSON leaves U+2028/9 and NEL unescaped, and str.splitlines cut the line there.
    text = "Say hi\u2028(sent from my phone)\u2029\x85thanks"
    path = tmp_path / "p.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"prompt": "first"}).encode() + b"\r\n"
        + json.dumps({"prompt": text}, ensure_ascii=False).encode() + b"\n"
    )  # fmt: skip
    assert [t["instruction"] for t in read_prompts(path)] == ["first", text]
    # A byte that is not UTF-8 is named by its line and column (the mark is no column).
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(RolloutError) as info:
        read_prompts(path)
    assert f"{path}:2: not UTF-8 text: byte 0xe9 at column 16" in str(info.value)


async def test_generate_multi_turn_prompts_send_the_whole_conversation(
    client, settings, tmp_path
) -> None:
    def answer(body: dict) -> Reply:
        # Which turns the model was shown, in order: the reply is the proof.
        return text_reply(
            "|".join(f"{m['role']}:{m.get('content') or ''}" for m in body["messages"])
        )

    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    chat = [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "my name is Ada"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "hi Ada"},
        {"role": "user", "content": "what is my name?"},
    ]
    prompts = tmp_path / "chats.jsonl"
    prompts.write_text(
        json.dumps({"id": "chat", "messages": chat}) + "\n"
        + json.dumps({"id": "plain", "prompt": "hello"}) + "\n"
    )  # fmt: skip
    out = tmp_path / "chats.jsonl.out.jsonl"
    with FakeOpenAI(answer) as agent:
        code, stdout, err = await rollout(
            settings, "generate", "--prompts", str(prompts), "--model", f"{agent.base_url}#m",
            "--out", str(out), "--json",
        )  # fmt: skip
    assert code == 0, err
    rows = {r["id"]: r for r in datasets.load_dataset("json", data_files=str(out), split="train")}
    assert rows["chat"]["completion"] == (
        "system:be terse|user:my name is Ada|assistant:|tool:ok|assistant:hi Ada"
        "|user:what is my name?"
    )
    assert rows["chat"]["prompt"] == "what is my name?"
    sent = json.loads(rows["chat"]["messages"])
    assert [m["role"] for m in sent] == [m["role"] for m in chat] + ["assistant"]
    assert sent[2]["tool_calls"][0]["id"] == "c1"
    # A single prompt still gets the actor's own system prompt before it.
    assert (
        rows["plain"]["completion"].startswith("system:")
        and "|user:hello" in (rows["plain"]["completion"])
    )


def test_bad_multi_turn_rows_name_the_line_message_and_field(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    good = {"role": "user", "content": "hi"}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    cases = [
        ([{"role": "robot", "content": "x"}], ".messages[0].role: must be one of"),
        ([{"role": "user", "content": ""}], ".messages[0].content: must be a non-empty"),
        ([{"role": "user", "content": 3}], ".messages[0].content: must be a non-empty"),
        (["hi"], ".messages[0]: must be a chat message object"),
        ({"role": "user"}, ".messages: must be a non-empty list"),
        ([], ".messages: must be a non-empty list"),
        ([good, {"role": "assistant", "content": "yo"}], ".messages[1].role: the last message"),
        ([good, {"role": "system", "content": "s"}, good], ".messages[1].role: a system"),
        ([{**good, "weight": 1}], ".messages[0]: unknown field(s) weight"),
        ([good, {"role": "tool", "tool_call_id": "nope", "content": "r"}, good],
         ".messages[1].tool_call_id: must name a tool call"),
        ([good, {"role": "assistant", "tool_calls": [{**call, "function": {"name": "f",
          "arguments": "{bad"}}]}, good], ".messages[1].tool_calls[0].function.arguments"),
        ([good, {"role": "user", "content": "x", "tool_calls": [call]}, good],
         ".messages[1].tool_calls: only an assistant"),
    ]  # fmt: skip
    for messages, message in cases:
        path.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"messages": messages}))
        with pytest.raises(RolloutError) as info:
            read_prompts(path)
        assert f"{path}:2{message}" in str(info.value), (messages, str(info.value))
    path.write_text(json.dumps({"messages": [good, {"role": "assistant", "tool_calls": [call]},
                                             {"role": "tool", "tool_call_id": "c1",
                                              "content": "r"}, good]}))  # fmt: skip
    [task] = read_prompts(path)
    assert task["instruction"] == "hi" and [m["role"] for m in task["messages"]] == [
        "user", "assistant", "tool"
    ]  # fmt: skip
    assert TaskSpec.model_validate(task).messages == task["messages"]
    # An env file's task with earlier turns is checked the same way when it is pushed.
    with pytest.raises(ValidationError, match=r"messages\[0\]\.role: must be one of"):
        TaskSpec.model_validate({"instruction": "x", "messages": [{"role": "robot"}]})


def test_a_torn_last_line_is_dropped_and_other_files_refused(tmp_path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"rollout_id": "a"}\n{"rollout_id": "b"}\n{"rollout_')
    assert written_ids(path) == {"a", "b"}
    assert path.read_text().endswith('"b"}\n')
    path.write_text('{"text": "someone else\'s file"}\n')
    with pytest.raises(RolloutError, match="rows.jsonl:1: not a row of rollout generate"):
        written_ids(path)


def test_a_prompts_file_that_is_not_utf8_is_named_not_a_traceback(tmp_path, capsys) -> None:
    from rollout.cli import main

    path = tmp_path / "bin.jsonl"
    path.write_bytes(b"\xff\xfe\x00binary")
    out = tmp_path / "o.jsonl"
    code = main(
        ["generate", "--model", "local/scripted", "--prompts", str(path), "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"{path}:1: not UTF-8 text: byte 0xff at column 1" in err
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(RolloutError) as info:
        read_prompts(path)
    assert f"{path}:2: not UTF-8 text: byte 0xe9 at column 16" in str(info.value)
    assert not out.exists()


async def test_a_second_generate_on_the_same_out_is_refused_while_the_first_writes(
    client, settings, tmp_path
) -> None:
    # The first model call is answered at once, the others only once released: the first
    # generate has a durable row and is still working when the second one starts.
    release = threading.Event()
    answered = threading.Lock()
    first = []

    def answer(body: dict) -> Reply:
        with answered:
            hold = bool(first)
            first.append(True)
        if hold:
            release.wait(120)
        return _echo(0.0)(body)

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(4)))
    out = tmp_path / "race.jsonl"
    with FakeOpenAI(answer) as agent:
        args = ["generate", "--prompts", str(prompts), "--model", f"{agent.base_url}#m",
                "--batch-size", "1", "--out", str(out)]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rollout.cli", *args, env=_cli_env(settings),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:

            async def first_row() -> bool:
                assert proc.returncode is None, (await proc.stderr.read()).decode()
                return bool(_lines(out))

            await wait_until(first_row, "the first generate's first row", 90, interval_s=0.02)
            second = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "rollout.cli", *args, env=_cli_env(settings),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:  # refused at once: it never waits on the first one's run
                raw_out, raw_err = await asyncio.wait_for(second.communicate(), 60)
            except TimeoutError:
                second.kill()
                await second.wait()
                raise AssertionError("the second generate was not refused at once") from None
            code, stdout, err = second.returncode, raw_out.decode(), raw_err.decode()
            assert code == 1 and stdout == "" and "Traceback" not in err, err
            assert f"--out {out}: is being written by another generate (pid {proc.pid})" in err
            assert len(_lines(out)) == 1  # the refused one wrote nothing
        finally:
            release.set()
        stdout, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert "4 rows (all new)" in stdout.decode()
    ids = [r["rollout_id"] for r in _lines(out)]
    assert len(ids) == 4 and len(set(ids)) == 4  # every row once
    assert not (tmp_path / "race.jsonl.generate.lock").exists()
    assert len(await client.list_runs()) == 1


def test_a_held_out_is_refused_at_once_and_a_stale_lock_file_is_not(tmp_path, capsys) -> None:
    from rollout.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    out = tmp_path / "o.jsonl"
    command = [
        "generate",
        "--model",
        "local/scripted",
        "--prompts",
        str(prompts),
        "--out",
        str(out),
    ]
    req = GenerateRequest(model="local/scripted", out=out, prompts=prompts)
    with out_lock(req):  # what a running generate holds (a lock of its own file, like another's)
        assert main(command) == 1
        err = capsys.readouterr().err
        assert f"--out {out}: is being written by another generate (pid {os.getpid()})" in err
        assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]  # nothing written
    # A lock file left by a killed generate (its pid long gone) is taken over, then removed.
    req.lock_path.write_text("999999999\n")
    with out_lock(req):
        assert req.lock_path.read_text() == f"{os.getpid()}\n"
    assert not req.lock_path.exists()


def test_an_out_that_cannot_be_written_is_named_not_a_traceback(tmp_path, capsys) -> None:
    from rollout.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    for out, reason in (
        ("/proc/version.jsonl", "cannot write there (No such file or directory: /proc/version"),
        (f"{prompts}/o.jsonl", "cannot make its folder"),  # a parent that is a file
    ):
        code = main(["generate", "--model", "local/scripted", "--prompts", str(prompts),
                     "--out", out])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 1 and "Traceback" not in err, err
        assert f"--out {out}: " in err and reason in err, err
    assert not os.path.exists("/proc/version.jsonl.generate.json")


@pytest.mark.parametrize(
    ("answer", "reply", "passed"),
    [
        ("391", "The answer is 391.", True),
        ("391", " ".join(str(i) for i in range(1000)), False),  # every candidate: last is 999
        (391, "391", True),
        ("C", "c", True),
        ("C", "A B C D E", False),
        ("no", "I know the answer.", False),
        ("Paris", "Paris is the capital", False),
        ("Paris", "Paris.", True),
    ],
)
async def test_a_prompts_answer_is_not_passed_by_listing_every_candidate(
    tmp_path, answer, reply, passed
) -> None:
    from rollout.generate import prompts_environment, read_prompts
    from rollout.shared.contracts.trajectory import Trajectory
    from rollout.shared.envs.engine import score

    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "which?", "answer": answer}) + "\n")
    env = prompts_environment(read_prompts(path))
    said = [{"role": "user", "content": "which?"}, {"role": "assistant", "content": reply}]
    result = await score(env, 0, Trajectory(messages=said, final_output=reply))
    assert result.passed is passed, result.primitives[0].reason


def test_parquet_output_writes_no_progress_bars_to_stderr(tmp_path, capfd) -> None:
    # As export's: the CLI says what it wrote in one line ("Creating parquet from Arrow
    # format: 0%|" was printed, its carriage returns escaped). On, as a fresh process has them.
    datasets.enable_progress_bars()
    rows = tmp_path / "gen.parquet.partial.jsonl"
    rows.write_text(
        "".join(json.dumps({"id": f"p{i}", "completion": "x"}) + "\n" for i in range(3))
    )
    write_parquet(rows, tmp_path / "gen.parquet")
    assert capfd.readouterr().err == ""
    assert datasets.load_dataset("parquet", data_files=str(tmp_path / "gen.parquet"))
