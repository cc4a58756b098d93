"""Batch inference: a model over an env's tasks (or a prompts file) as a run, rows to a file.

A generate IS a run: the tracker expands it into batched work items that the actor pool runs
exactly once, with policy versions; its rollouts are streamed out of the run's events as they
are scored. A prompts file becomes a tool-less `custom` environment pushed under a slug named
after its content hash, so it is versioned and cached like any other.

Resumable: a sidecar `OUT.generate.json` holds the run's client request id before the run is
asked for (a re-run asks with the same id and gets the same run, never a second one) and the
run id after. Rows are appended to a JSONL file one line at a time (flushed and fsynced); a
re-run reads back the rollout ids already there (dropping a torn last line) and writes only the
others, so after any kill the output holds each rollout exactly once. Parquet is written from
that JSONL sidecar when the run is done.

A row is written only with its conversation. A trajectory the object store does not give (out
of reach from here) is read from the tracker's read models, waited for up to READ_MODELS_WAIT_S;
one they do not hold by then leaves its row unwritten and the generate unfinished, said by
prompt, and the same command run again writes it.

One generate at a time per --out: it holds an exclusive lock on `OUT.generate.lock` for the
whole command (flock, so a killed generate's lock goes with its process and never blocks the
resume), and a second generate on that --out is refused at once, naming the holder's pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.errors import RolloutError
from rollout.printable import redraw
from rollout.shared import subjects
from rollout.shared.aggregates.run_options import REFUSED, option_problems, total_problem
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.requests import NobodyAnswered
from rollout.shared.contracts.chat import check_messages
from rollout.shared.contracts.envelope import EventEnvelope, new_id
from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.requests import CreateRun
from rollout.shared.envs.judged import NOTHING_SCORED, judges_nothing
from rollout.shared.jsonl import read_jsonl
from rollout.shared.objectstore import ObjectStore
from rollout.shared.objectstore.errors import ObjectStoreError
from rollout.shared.settings import NatsUnreachable
from rollout.shared.store.trajectories import load_trajectory, object_store

FORMATS = {".jsonl": "jsonl", ".parquet": "parquet"}
MAX_PROMPTS = 100_000
STATE_SUFFIX = ".generate.json"
PARTIAL_SUFFIX = ".partial.jsonl"
LOCK_SUFFIX = ".generate.lock"
# How long the rows whose trajectories the object store did not give wait for the tracker's
# read models to hold them (a projector is seconds behind the event log, unless it stalls).
READ_MODELS_WAIT_S = 30.0
READ_MODELS_POLL_S = 0.5


@dataclass
class GenerateRequest:
    """What `rollout generate` was asked: the model, the tasks, the sampling and the output."""

    model: str
    out: Path
    env: str | None = None
    prompts: Path | None = None
    split: str | None = None
    env_version: int | None = None
    n: int = 1
    score: bool = False
    temperature: float = 0.7
    max_tokens: int = 512
    max_tool_calls: int = 16
    seed: int | None = None
    batch_size: int = 16
    deadline_s: float = 3600.0

    @property
    def format(self) -> str:
        """jsonl or parquet, from the output's suffix."""
        fmt = FORMATS.get(self.out.suffix.lower())
        if fmt is None:
            raise RolloutError(
                f"--out {self.out}: unknown format {self.out.suffix or '(no suffix)'!r}",
                problems=["name the output FILE.jsonl or FILE.parquet"],
            )
        return fmt

    @property
    def rows_path(self) -> Path:
        """Where rows are appended line by line (the output itself for JSONL)."""
        if self.format == "jsonl":
            return self.out
        return self.out.with_name(self.out.name + PARTIAL_SUFFIX)

    @property
    def state_path(self) -> Path:
        """The sidecar holding the run's request id and run id (what a re-run resumes)."""
        return self.out.with_name(self.out.name + STATE_SUFFIX)

    @property
    def lock_path(self) -> Path:
        """The file a running generate holds locked, so no second one writes the same --out."""
        return self.out.with_name(self.out.name + LOCK_SUFFIX)


@dataclass
class GenerateResult:
    """How a generate ended: its run, rows written now and in all, where."""

    run_id: str
    out: Path
    rows: int
    written_now: int
    status: str
    resumed: bool = False
    reason: str | None = None
    # Why the run's verdicts measure nothing (NOTHING_SCORED), None when they do.
    no_verdict: str | None = None
    # The read models' lag where rows came from them (trajectories the object store did not
    # give, read from the tracker at the end: rollout.shared.stale); None when none did.
    read_models: dict[str, Any] | None = None
    # Rows not written: their trajectories were in neither the object store nor, by the
    # deadline, the read models (a re-run writes them). Each: id, task and sample, prompt.
    missing: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The JSON form `--json` prints."""
        return {
            "runId": self.run_id,
            "out": str(self.out),
            "rows": self.rows,
            "writtenNow": self.written_now,
            "status": self.status,
            "resumed": self.resumed,
            "reason": self.reason,
            "noVerdict": self.no_verdict,
            "readModels": self.read_models,
            "missing": self.missing,
        }

    def missing_error(self) -> RolloutError:
        """The refusal of the rows not written: which prompts, why, and that a re-run resumes."""
        behind = (self.read_models or {}).get("behind")
        lag = f" (they are {behind} event(s) behind the log)" if behind else ""
        return RolloutError(
            f"run {self.run_id} {self.status}: {len(self.missing)} row(s) not written to "
            f"{self.out}: their trajectories are not in the object store this machine reaches, "
            f"and the tracker's read models did not have them within {READ_MODELS_WAIT_S:g} s"
            f"{lag}",
            problems=[
                *(
                    f"{m['id']} (task {m['taskIndex']}, sample {m['sampleIndex']}): "
                    f"{(m['prompt'] or '')[:80]!r}"
                    for m in self.missing[:20]
                ),
                *([f"and {len(self.missing) - 20} more"] if len(self.missing) > 20 else []),
                f"run the same command again to resume: the {self.rows} row(s) written are kept, "
                "and these are written once the read models have caught up (`rollout status` "
                "says how far behind they are)",
            ],
        )


# --- prompts files ---------------------------------------------------------------------------


def read_prompts(path: Path) -> list[dict[str, Any]]:
    """The prompts file as tasks: each line `{"prompt": str}` or `{"messages": [...]}`, + "id".

    `messages` is a chat (system first if any, user/assistant turns, assistant tool calls and
    their tool results) that ends with the user turn the model answers; the turns before it
    go with the task. An optional `answer` on every line is scored with `final_answer_match`
    (see `answer_mode`); errors name the file, line and field, and nothing runs on a bad file.
    """
    tasks: list[dict[str, Any]] = []
    ids: dict[str, int] = {}
    for number, row in read_jsonl(path):
        where = f"{path}:{number}"
        if len(tasks) >= MAX_PROMPTS:
            raise RolloutError(f"{path}: more than {MAX_PROMPTS} prompts")
        unknown = sorted(set(row) - {"id", "prompt", "messages", "answer"})
        if unknown:
            raise RolloutError(f"{where}: unknown field(s) {', '.join(unknown)}")
        instruction, history = _instruction(row, where)
        task_id = row.get("id", number - 1)
        if not isinstance(task_id, str | int) or isinstance(task_id, bool):
            raise RolloutError(f"{where}.id: must be a string or an integer")
        task_id = str(task_id)
        if task_id in ids:
            raise RolloutError(f"{where}.id: {task_id!r} repeats line {ids[task_id]}")
        ids[task_id] = number
        task: dict[str, Any] = {"instruction": instruction, "id": task_id}
        if history:
            task["messages"] = history
        if "answer" in row:
            task["hiddenGroundTruth"] = {"answer": row["answer"]}
        _check_storable(task, where)
        tasks.append(task)
    if not tasks:
        raise RolloutError(f"--prompts {path}: no prompts")
    answered = sum("hiddenGroundTruth" in t for t in tasks)
    if 0 < answered < len(tasks):
        raise RolloutError(
            f"--prompts {path}: {answered} of {len(tasks)} lines have an 'answer'",
            problems=["give every line an answer (to score them) or none"],
        )
    return tasks


def _check_storable(task: dict[str, Any], where: str) -> None:
    """A line's text must be UTF-8 and its numbers finite (the spec travels as JSON)."""
    try:
        json.dumps(task, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except ValueError as exc:  # UnicodeEncodeError is one
        what = (
            f"holds {exc.object[exc.start]!r}, which is not UTF-8 text"
            if isinstance(exc, UnicodeEncodeError)
            else "holds a number that is not finite (NaN or infinity)"
        )
        raise RolloutError(f"{where}: {what}") from None


def _instruction(row: dict[str, Any], where: str) -> tuple[str, list[dict[str, Any]] | None]:
    """(the last user turn, the turns before it) of a prompts-file line."""
    if ("prompt" in row) == ("messages" in row):
        raise RolloutError(f"{where}: give exactly one of 'prompt' or 'messages'")
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise RolloutError(f"{where}.prompt: must be a non-empty string")
        return row["prompt"], None
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise RolloutError(f"{where}.messages: must be a non-empty list of chat messages")
    try:
        check_messages(messages, f"{where}.messages")
    except ValueError as exc:
        raise RolloutError(str(exc)) from None
    last = messages[-1]
    if last["role"] != "user":
        raise RolloutError(
            f"{where}.messages[{len(messages) - 1}].role: the last message must be the user "
            f"turn the model answers, not {last['role']!r}"
        )
    history = [dict(m) for m in messages[:-1]]
    return last["content"], history or None


_NUMBER = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


def answer_mode(tasks: list[dict[str, Any]]) -> str:
    """How the answers are matched: `numeric` (the reply's last number) when every answer is a
    number, else `exact` (the whole reply, trimmed, any case, a final full stop aside). Never
    `contains`: a reply listing every candidate ("A B C D E", "0 1 2 ... 999") would contain
    the answer."""
    answers = [t["hiddenGroundTruth"]["answer"] for t in tasks if "hiddenGroundTruth" in t]
    numeric = all(
        (isinstance(a, int | float) and not isinstance(a, bool))
        or (isinstance(a, str) and _NUMBER.match(a))
        for a in answers
    )
    return "numeric" if answers and numeric else "exact"


def prompts_environment(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """A tool-less `custom` environment whose tasks are the prompts (slug from their hash)."""
    digest = hashlib.sha256(
        json.dumps(tasks, sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()
    answered = "hiddenGroundTruth" in tasks[0]
    primitive = (
        {"name": "answer", "type": "final_answer_match", "mode": answer_mode(tasks)}
        if answered
        # Nothing to check: one verdict per rollout still ends the run the usual way (a
        # verdict on nothing: `judges_nothing` says so, and no pass rate is shown for it).
        else {"name": "completed", "type": "no_tool_errors"}
    )
    return {
        "slug": f"prompts-{digest[:12]}",
        "name": "Prompts for rollout generate",
        "template": "custom",
        "config": {"tools": []},
        "tasks": tasks,
        "verifier": {"primitives": [primitive]},
    }


# --- the output file -------------------------------------------------------------------------


def cannot_write(out: Path, exc: OSError, path: Path | None = None) -> RolloutError:
    """The error for an --out whose files cannot be written (a read-only or virtual folder)."""
    reason = exc.strerror or str(exc)
    if path is not None:
        reason = f"{reason}: {path}"
    return RolloutError(
        f"--out {out}: cannot write there ({reason})",
        problems=["choose an --out in a folder you can write to"],
    )


def _lock_holder(fd: int) -> str:
    """The pid the lock file names (written by its holder), as ' (pid N)', or ''."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""


@contextlib.contextmanager
def out_lock(req: GenerateRequest) -> Iterator[None]:
    """Hold `req.out` for this process; another generate on it is refused (never run twice)."""
    path = req.lock_path
    # A few tries: a lock taken on a file its last holder unlinked as it ended guards nothing.
    for _ in range(10):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise cannot_write(req.out, exc, path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd)
            os.close(fd)
            raise RolloutError(
                f"--out {req.out}: is being written by another generate{holder}",
                problems=[
                    f"wait for it to end (it holds {path}), or choose another --out",
                    "nothing was written by this command",
                ],
            ) from None
        except OSError as exc:  # a filesystem without locks: refuse rather than risk two
            os.close(fd)
            raise RolloutError(
                f"--out {req.out}: cannot lock {path} ({exc.strerror or exc})",
                problems=["choose an --out on a local filesystem"],
            ) from None
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(os.fstat(fd), current):
            break
        os.close(fd)
    else:
        raise RolloutError(f"--out {req.out}: cannot take the lock {path}; try again")
    try:
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:
            raise cannot_write(req.out, exc, path) from None
        yield
    finally:
        # Unlinked while still held: whoever opened it meanwhile sees it gone and retries.
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def written_ids(path: Path) -> set[str]:
    """Rollout ids already in the rows file; a torn last line (a kill mid-write) is cut off."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with path.open("r+b") as f:
            f.truncate(end)
    ids = set()
    for number, line in enumerate(data[:end].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            ids.add(json.loads(line)["rollout_id"])
        except (ValueError, KeyError, TypeError):
            raise RolloutError(
                f"{path}:{number}: not a row of rollout generate; choose another --out"
            ) from None
    return ids


class RowWriter:
    """Appends rows to a JSONL file, each durable before the next (what a resume relies on)."""

    def __init__(self, path: Path, out: Path | None = None) -> None:
        self.path = path
        self.out = out or path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")
        except OSError as exc:
            raise cannot_write(self.out, exc, path) from None

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Append rows and make them durable."""
        try:
            for row in rows:
                self._file.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:  # a full disk: the rows before these are durable, resume later
            raise cannot_write(self.out, exc, self.path) from None

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def write_parquet(rows_path: Path, out: Path) -> None:
    """The JSONL rows as one Parquet file (through `datasets`, so it loads back the same)."""
    import datasets

    # The CLI says what it wrote in one line; datasets' bars are noise on stderr (and escaped).
    datasets.disable_progress_bars()
    dataset = datasets.Dataset.from_json(str(rows_path), keep_in_memory=True)
    tmp = out.with_name(out.name + ".tmp")
    try:
        dataset.to_parquet(str(tmp))
        os.replace(tmp, out)
    except OSError as exc:
        raise cannot_write(out, exc, tmp) from None


# The run request's fields as `rollout generate` spells them.
_FLAGS = {"n": "-n", "batch_size": "--batch-size", "max_tool_calls": "--max-tool-calls",
          "temperature": "--temperature", "deadline_s": "--deadline", "split": "--split",
          "model": "--model", "max_tokens": "--max-tokens", "seed": "--seed"}  # fmt: skip


def _as_flag(problem: str) -> str:
    field, sep, rest = problem.partition(":")
    return f"{_FLAGS.get(field, field)}:{rest}" if sep else problem


def _read_state(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        raise RolloutError(f"{path}: not a generate state file; remove it to start over") from None


def _write_state(req: GenerateRequest, state: dict[str, Any]) -> None:
    path = req.state_path
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(state, indent=2), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise cannot_write(req.out, exc, tmp) from None


# --- rows ------------------------------------------------------------------------------------


def output_row(
    generated: Any,
    scored: Any,
    *,
    run: dict[str, Any],
    tasks: list[Any],
    trajectory: dict[str, Any] | None,
    score: bool,
) -> dict[str, Any]:
    """One output row: ids, prompt, completion, conversation, lineage (and the verdict)."""
    task = tasks[generated.task_index] if generated.task_index < len(tasks) else None
    messages = (trajectory or {}).get("messages") or []
    row: dict[str, Any] = {
        "id": (task.id if task is not None and task.id is not None else str(generated.task_index)),
        "rollout_id": generated.rollout_id,
        "run_id": run["runId"],
        "task_index": generated.task_index,
        "sample_index": generated.sample_index,
        "prompt": task.instruction if task is not None else None,
        "completion": (trajectory or {}).get("final_output"),
        "messages": json.dumps(messages, ensure_ascii=False),
        "model": generated.model,
        "policy_version": generated.policy_version,
        "env_slug": run["envSlug"],
        "env_version": run["envVersion"],
        "env_hash": generated.env_hash,
        "seed": generated.seed,
        "error": scored.error if scored.outcome == "errored" else None,
    }
    if score:
        row.update(
            score=scored.score,
            passed=scored.passed,
            outcome=scored.outcome,
            primitives=json.dumps([p.model_dump(mode="json") for p in scored.primitives]),
        )
    return row


ProgressFn = Callable[[int, int, int], None]


def progress_bar(done: int, total: int, written: int, width: int = 30) -> None:
    """The progress bar on stderr: rollouts done of the run, rows written by this process."""
    filled = int(width * done / total) if total else 0
    bar = "█" * filled + "░" * (width - filled)
    redraw(f"  [{bar}] {done}/{total or '?'} rollouts, {written} rows written  ")


@dataclass
class Progress:
    """A generate's progress: drawn as a bar on stderr (unless `quiet`), and what an
    interrupted generate says of it (`stopped_line`)."""

    req: GenerateRequest
    quiet: bool = False
    total: int | None = None
    drawn: bool = False

    def __call__(self, done: int, total: int, written: int) -> None:
        self.total = total or self.total
        if not self.quiet:
            progress_bar(done, total, written)
            self.drawn = True

    def stopped_line(self) -> str:
        """One line: how many rows of how many are written, where, and how to resume."""
        req = self.req
        rows = _rows_in(req.rows_path)
        what = "prompts" if req.prompts is not None else "tasks"
        if self.total is None:  # stopped while its run was asked for
            count = f" before its run started: {rows} rows"
        elif req.n == 1:
            count = f": {rows} of {self.total} {'prompts' if what == 'prompts' else 'rows'}"
        else:
            count = f": {rows} of {self.total} rows ({self.total // req.n} {what} × {req.n})"
        later = f" ({req.out} is written once all are)" if req.rows_path != req.out else ""
        return (
            f"{chr(10) if self.drawn else ''}interrupted{count} written to {req.rows_path}"
            f"{later}; run the same command again to resume (the rows written are kept, and "
            "none is written twice)"
        )


def _rows_in(path: Path) -> int:
    """Complete rows in a rows file (0 when there is none): each ends with a newline."""
    try:
        with path.open("rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return 0


async def generate(
    client: Any, req: GenerateRequest, *, progress: ProgressFn | None = None
) -> GenerateResult:
    """Run `req` as a run through the actor pool and stream its rollouts to `req.out`."""
    fmt = req.format
    if (req.env is None) == (req.prompts is None):
        raise RolloutError("give exactly one of --env SLUG or --prompts FILE.jsonl")
    if req.n < 1:
        raise RolloutError(f"-n must be >= 1, got {req.n}")
    # The run's options as the tracker will judge them, before a state file or an env exists.
    options = CreateRun(
        env_slug=req.env or "prompts", model=req.model, n=req.n, temperature=req.temperature,
        max_tool_calls=req.max_tool_calls, max_tokens=req.max_tokens, seed=req.seed,
        split=req.split, batch_size=req.batch_size, deadline_s=req.deadline_s,
    )  # fmt: skip
    if problems := option_problems(options):
        raise RolloutError("invalid generate options", problems=[_as_flag(p) for p in problems])
    env: dict[str, Any] | None = None
    source: dict[str, Any] = {"env": req.env, "env_version": req.env_version}
    if req.prompts is not None:
        if req.split is not None:
            raise RolloutError("--split applies to --env; a prompts file has no splits")
        prompt_tasks = read_prompts(req.prompts)
        # The tracker's cap on one run, said before the prompts are pushed as an env.
        if (too_big := total_problem(len(prompt_tasks), req.n)) is not None:
            raise RolloutError(
                "invalid generate options",
                problems=[_as_flag(too_big), f"or split {req.prompts} into several files"],
            )
        if req.score and "hiddenGroundTruth" not in prompt_tasks[0]:
            raise RolloutError(
                f"--score: the prompts in {req.prompts} have no 'answer' to score against",
                problems=["give every line an 'answer', or leave --score off"],
            )
        env = prompts_environment(prompt_tasks)
        source = {"prompts": env["slug"]}
    params = {
        **source,
        "model": req.model,
        "split": req.split,
        "n": req.n,
        "score": req.score,
        "temperature": req.temperature,
        "max_tokens": req.max_tokens,
        "max_tool_calls": req.max_tool_calls,
        "seed": req.seed,
        "batch_size": req.batch_size,
        "format": fmt,
    }
    try:
        # Made on purpose: a new dataset's folder need not exist yet.
        req.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RolloutError(
            f"--out {req.out}: cannot make its folder: {exc.strerror or exc}"
        ) from None
    # Held from before the state file is read until the last row is written: two generates
    # on one --out would otherwise attach to the same run and both append every row.
    with out_lock(req):
        env_slug, env_version = req.env, req.env_version
        if env is not None:
            pushed = await client.push_environment(env)
            env_slug, env_version = pushed["slug"], pushed["version"]
        return await _generate_locked(
            client, req, fmt, params, env_slug, env_version, progress=progress
        )


async def _generate_locked(
    client: Any,
    req: GenerateRequest,
    fmt: str,
    params: dict[str, Any],
    env_slug: str | None,
    env_version: int | None,
    *,
    progress: ProgressFn | None,
) -> GenerateResult:
    """`generate` past its checks, with `req.out` locked: start or resume the run, write rows."""
    state = _read_state(req.state_path)
    if state is not None and state.get("refused") and state.get("params") != params:
        # The tracker refused that start (or it never reached one), so no run exists: the
        # corrected command starts over rather than being refused as another generate. (A start without a run id but not
        # refused may have made its run, its answer lost: that one is resumed or refused.)
        state = None
    resumed = state is not None
    if state is None:
        if req.out.exists() or req.rows_path.exists():
            raise RolloutError(
                f"--out {req.out}: already exists and is not a generate in progress",
                problems=["choose another --out, or remove the file"],
            )
        state = {"params": params, "client_request_id": new_id()}
        _write_state(req, state)
    elif state.get("params") != params:
        raise RolloutError(
            f"--out {req.out}: was started by another generate ({req.state_path} differs)",
            problems=["re-run it with the same options to resume, or choose another --out"],
        )
    if state.get("done") and req.out.exists():
        rows = len(written_ids(req.rows_path)) if fmt == "jsonl" else state.get("rows", 0)
        return GenerateResult(
            state["run_id"], req.out, rows, 0, "completed", resumed=True,
            no_verdict=state.get("no_verdict"),
        )  # fmt: skip

    try:
        run = await _create_run(client, req, state, env_slug, env_version)
    except RolloutError as exc:
        # No run exists when the tracker refused the start, or when this state's first
        # request never reached one (a resume's earlier try, its answer lost, may have made
        # it): a corrected command then starts over; this one, re-run, asks again.
        unsent = isinstance(exc, NatsUnreachable | NobodyAnswered) and not resumed
        if exc.message == REFUSED or unsent:
            _write_state(req, state | {"refused": True})
        raise
    run_id = run["runId"]
    if state.get("run_id") != run_id or state.get("refused"):
        state.pop("refused", None)
        state["run_id"] = run_id
        _write_state(req, state)
    return await _stream_run(client, req, fmt, state, run, resumed, progress=progress)


async def _create_run(
    client: Any,
    req: GenerateRequest,
    state: dict[str, Any],
    env_slug: str | None,
    env_version: int | None,
) -> dict[str, Any]:
    return await client.create_run(
        env_slug,
        req.model,
        req.n,
        temperature=req.temperature,
        max_tool_calls=req.max_tool_calls,
        max_tokens=req.max_tokens,
        seed=req.seed,
        split=req.split,
        batch_size=req.batch_size,
        deadline_s=req.deadline_s,
        env_version=env_version,
        name=f"generate {req.out.name}",
        client_request_id=state["client_request_id"],
    )


async def _stream_run(
    client: Any,
    req: GenerateRequest,
    fmt: str,
    state: dict[str, Any],
    run: dict[str, Any],
    resumed: bool,
    *,
    progress: ProgressFn | None,
) -> GenerateResult:
    """Write the run's rows to `req.out` as they are scored (rows already written are kept)."""
    run_id = run["runId"]
    # From the reply (the read model may not show a run this new yet).
    summary = {
        "runId": run_id,
        "envSlug": run["env_slug"],
        "envVersion": run["env_version"],
        "envHash": run["env_hash"],
        "total": len(run["task_indices"]) * run["n"],
    }
    doc = await client.get_environment(summary["envSlug"], summary["envVersion"])
    tasks = EnvironmentSpec.model_validate(doc.get("spec", doc)).tasks
    no_verdict = NOTHING_SCORED if judges_nothing(doc.get("spec", doc)) else None

    done_ids = written_ids(req.rows_path)
    writer = RowWriter(req.rows_path, req.out)
    written_now = 0
    try:
        written_now, status, reason, read_models, missing = await _stream(
            client, run_id, summary, tasks, req, done_ids, writer, progress
        )
    finally:
        writer.close()
    total_rows = len(done_ids)
    if missing:
        # Not done: a re-run follows the run again and writes only these (written_ids).
        return GenerateResult(
            run_id, req.out, total_rows, written_now, status, resumed=resumed, reason=reason,
            no_verdict=no_verdict, read_models=read_models, missing=missing,
        )  # fmt: skip
    if status == "completed" or status == "failed":
        if fmt == "parquet":
            write_parquet(req.rows_path, req.out)
            req.rows_path.unlink()
        state.update(done=True, rows=total_rows, status=status, no_verdict=no_verdict)
        _write_state(req, state)
    return GenerateResult(
        run_id, req.out, total_rows, written_now, status, resumed=resumed, reason=reason,
        no_verdict=no_verdict, read_models=read_models,
    )  # fmt: skip


async def _stream(
    client: Any,
    run_id: str,
    run: dict[str, Any],
    tasks: list[Any],
    req: GenerateRequest,
    done_ids: set[str],
    writer: RowWriter,
    progress: ProgressFn | None,
) -> tuple[int, str, str | None, dict[str, Any] | None, list[dict[str, Any]]]:
    """Follow the run's events from its start; write each newly scored rollout once.

    Returns rows written, the run's ending and reason, the read models' lag when rows came
    from them (`readModels`; None when none did), and the rows not written (see missing).
    """
    js = await client.jetstream()
    generated: dict[str, Any] = {}
    # Trajectories sit in the object store (events carry their claim checks): each is read
    # there as its rollout is scored; where the store is out of reach, from the tracker at
    # the end.
    store = _reachable_store(client)
    deferred: list[tuple[Any, Any]] = []
    total = run.get("total") or 0
    written = 0
    status, reason = "running", None
    if progress is not None:  # the rows a resume keeps, and the total, before any event
        progress(len(done_ids), total, written)
    # Closed here, before the client's connection is (its consumer is unsubscribed cleanly).
    async with contextlib.aclosing(
        read_events(js, subjects.run_events(run_id), follow=True)
    ) as events:
        async for msg in events:
            event = EventEnvelope.from_bytes(msg.data)
            body: Any = event.body()
            if event.type == "run.started":
                total = body.total_rollouts
            elif event.type == "rollout.generated":
                for g in body.rollouts:
                    generated.setdefault(g.rollout_id, g)
            elif event.type == "rollout.scored":
                rows = []
                for s in body.rollouts:
                    g = generated.get(s.rollout_id)
                    if g is None or s.rollout_id in done_ids:
                        continue
                    done_ids.add(s.rollout_id)
                    trajectory = g.trajectory
                    if trajectory is None and g.trajectory_uri:
                        trajectory = await _fetched(store, g)
                        if trajectory is None:
                            deferred.append((g, s))
                            continue
                    rows.append(
                        output_row(
                            g, s, run=run, tasks=tasks, trajectory=trajectory, score=req.score
                        )
                    )
                writer.write(rows)
                written += len(rows)
            if progress is not None:
                progress(len(done_ids), total, written)
            if event.type in ("run.completed", "run.failed"):
                status = "completed" if event.type == "run.completed" else "failed"
                reason = getattr(body, "reason", None)
                break
    if store is not None:
        await store.close()
    read_models, missing = None, []
    if deferred:
        # From the tracker's read models, once they hold every one: a row is never written
        # without its conversation. The reply says how far behind they are.
        stored, read_models = await _from_read_models(client, run_id, [s for _, s in deferred])
        rows = []
        for g, s in deferred:
            trajectory = stored.get(s.rollout_id)
            if trajectory is None:
                done_ids.discard(s.rollout_id)  # not written: neither counted nor kept
                task = tasks[g.task_index] if g.task_index < len(tasks) else None
                missing.append(
                    {
                        "id": task.id if task is not None and task.id is not None
                        else str(g.task_index),
                        "rolloutId": s.rollout_id,
                        "taskIndex": g.task_index,
                        "sampleIndex": g.sample_index,
                        "prompt": task.instruction if task is not None else None,
                    }
                )  # fmt: skip
                continue
            rows.append(
                output_row(g, s, run=run, tasks=tasks, trajectory=trajectory, score=req.score)
            )
        writer.write(rows)
        written += len(rows)
    return written, status, reason, read_models, missing


async def _from_read_models(
    client: Any, run_id: str, scored: list[Any]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """The trajectories of `scored` the tracker's read models hold, polled until they hold
    them all or READ_MODELS_WAIT_S passes, and how far behind the read models were."""
    wanted = {s.rollout_id for s in scored}
    deadline = time.monotonic() + READ_MODELS_WAIT_S
    while True:  # without trajectories: a rollout's row holds its trajectory once it is there
        listed = await client.get_run(run_id, True, False, include_tasks=False)
        present = wanted & {r["rolloutId"] for r in listed["rollouts"]}
        if present == wanted or time.monotonic() >= deadline:
            break
        await asyncio.sleep(READ_MODELS_POLL_S)
    if not present:
        return {}, listed.get("readModels")
    done = await client.get_run(run_id, True, True, include_tasks=False)
    stored = {
        r["rolloutId"]: r["trajectory"]
        for r in done["rollouts"]
        if r["rolloutId"] in wanted and r.get("trajectory") is not None
    }
    return stored, done.get("readModels")


def _reachable_store(client: Any) -> ObjectStore | None:
    """The platform's object store as this process's settings name it (None: out of reach)."""
    try:
        return object_store(client.settings)
    except (RolloutError, ObjectStoreError, OSError):
        return None


async def _fetched(store: ObjectStore | None, rollout: Any) -> dict[str, Any] | None:
    """A claim-checked trajectory, read and verified (None: left for the tracker)."""
    if store is None:
        return None
    try:
        return await load_trajectory(store, None, rollout.trajectory_uri, rollout.trajectory_sha256)
    except (RolloutError, ObjectStoreError, OSError):
        return None
