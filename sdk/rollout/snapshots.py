"""Dataset snapshots: runs' scored rollouts out as hf/parquet/jsonl datasets, and back in.

A row is one scored rollout with its lineage: which run, model and policy version produced it,
on which env (slug, version, content hash) and task, with what seed, and its verdict (score,
passed, outcome, per-primitive scores). Its trajectory (token ids and logprobs included) and
the task's tools are JSON text, so every environment's rows share one Arrow schema.

Import checks every row before writing anything, then builds the training sets with the
buffer's own builders (shared/learning/datasets.py) and the learner's row shapes
(shared/learning/trainer_rows.py): the SFT examples, DPO pairs, KTO rows and GRPO groups are
those the platform would train on from the same rollouts.

An output folder (import's DIR, an hf export's --out) is written beside its target and swapped
in whole, so only a missing or empty folder, or one an earlier run of the same command wrote,
is replaced: anything else in the way is named and nothing is deleted. An output file (a jsonl
or parquet export) likewise replaces only a missing or empty file or an earlier export of that
format, and its suffix must not say another format.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.reader import last_sequence, read_events
from rollout.shared.contracts.buffer import BufferData, GrpoGroupsQuery
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.snapshot import (
    FORMAT,
    DatasetSource,
    SnapshotRow,
    canonical_jsonl,
    lineage_of,
    row_problems,
    source_counts,
)
from rollout.shared.envs.engine import start_runtime
from rollout.shared.envs.judged import judges_nothing
from rollout.shared.jsondepth import bounded
from rollout.shared.jsonl import read_jsonl
from rollout.shared.learning.datasets import dpo_pairs, grpo_groups, sft_set
from rollout.shared.learning.trainer_rows import TrainingSet, dpo_rows, kto_rows, sft_rows
from rollout.shared.objectstore import content_key, sha256_bytes
from rollout.shared.stale import worst
from rollout.shared.store.trajectories import object_store

MAX_ROWS = 1_000_000
# The file formats and the suffix each is read back by (import, datasets.load_dataset).
FILE_FORMATS = {".jsonl": "jsonl", ".parquet": "parquet"}
# How much of a jsonl's first line is read to tell an earlier export (a long trajectory fits).
FIRST_LINE_LIMIT = 64 * 1024 * 1024


def _features() -> Any:
    import datasets

    kinds = {"int": "int64", "float": "float64", "bool": "bool"}
    features = {}
    for name, info in SnapshotRow.model_fields.items():
        text = str(info.annotation)
        kind = next((v for k, v in kinds.items() if k in text), "string")
        features[name] = datasets.Value(kind)
    return datasets.Features(features)


# --- export ----------------------------------------------------------------------------------


async def _task_tools(spec: Any, task_indices: Iterable[int]) -> dict[int, list[dict]]:
    # The runtime the actor built for a task is where its tool list comes from (as the buffer).

    tools = {}
    for index in task_indices:
        runtime = await start_runtime(spec, index)
        try:
            tools[index] = [t.to_openai() for t in runtime.tool_specs()]
        finally:
            await runtime.close()
    return tools


def snapshot_row(
    rollout: Mapping[str, Any],
    run: Mapping[str, Any],
    tasks: list[Any],
    tools: list[dict],
    source: str | None = None,
) -> dict[str, Any]:
    """One `get_rollouts` row (with its trajectory) and its run as a snapshot row."""
    trajectory = rollout.get("trajectory")
    if not isinstance(trajectory, Mapping):
        why = rollout.get("trajectoryOmitted") or "the tracker has none"
        raise RolloutError(f"rollout {rollout['rolloutId']}: no trajectory to export ({why})")
    index = int(rollout["taskIndex"])
    task = tasks[index] if index < len(tasks) else None
    messages = trajectory.get("messages") or []
    prompt = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    row = {
        "format": FORMAT,
        "rollout_id": rollout["rolloutId"],
        "run_id": rollout["runId"],
        "task_index": index,
        "sample_index": int(rollout["sampleIndex"]),
        "task_id": task.id if task is not None else None,
        "split": task.split if task is not None else None,
        "model": rollout.get("model") or run["model"],
        "policy_version": int(rollout.get("policyVersion") or 0),
        "seed": rollout.get("seed"),
        "env_slug": run["envSlug"],
        "env_version": int(run["envVersion"]),
        "env_hash": run.get("envHash") or "",
        "score": rollout.get("score"),
        "passed": rollout.get("passed"),
        "outcome": rollout.get("outcome"),
        "error": rollout.get("error"),
        "error_kind": rollout.get("errorKind"),
        "primitives": json.dumps(rollout.get("primitives") or [], ensure_ascii=False),
        # Cut at a depth (as the tracker's reply is): json.dumps recurses.
        "trajectory": json.dumps(bounded(trajectory), ensure_ascii=False),
        "tools": json.dumps(tools, ensure_ascii=False) if tools else None,
        "prompt": prompt if isinstance(prompt, str) else None,
        "completion": trajectory.get("final_output"),
        "source": source,
    }
    return _checked(row)


def _checked(row: dict[str, Any]) -> dict[str, Any]:
    """ROW, checked on the way out as import will check it: no export that import refuses."""
    problems = row_problems(SnapshotRow.model_validate(row))
    if problems:
        raise RolloutError(f"rollout {row['rollout_id']}: cannot be exported", problems=problems)
    return row


async def _run_source(client: Any, run_id: str) -> str | None:
    """Where the run's verdicts came from (its run.requested's `source`; None: verified here)."""
    subject = subjects.event("run", run_id, subjects.event_name("run.requested"))
    sources = [
        EventEnvelope.from_bytes(msg.data).body().source
        async for msg in read_events(await client.jetstream(), [subject])
    ]
    return sources[0] if sources else None


async def export_rows(
    client: Any,
    *,
    run_ids: list[str] | None = None,
    env_slug: str | None = None,
    include_errored: bool = False,
    unjudged: set[str] | None = None,
) -> list[dict[str, Any]]:
    """The scored rollouts of `run_ids` (or every completed run of `env_slug`) as rows.

    `unjudged`, when given, gets the envs (`slug@version`) of the runs whose env judges
    nothing (the tracker's `noVerdict`): their verdicts say only that no tool call failed.
    """
    if env_slug is not None:
        runs = await client.list_runs(1000, env_slug)
        run_ids = [r["runId"] for r in runs if r["status"] == "completed"]
        if not run_ids:
            raise RolloutError(f"environment {env_slug!r} has no completed runs to export")
    rows: list[dict[str, Any]] = []
    for run_id in dict.fromkeys(run_ids or []):
        run = await client.get_run(run_id, include_rollouts=True, include_trajectories=True)
        if run["status"] == "running":
            raise RolloutError(
                f"run {run_id} is still running",
                problems=["export it once it ends (`rollout show RUN`)"],
            )
        scored = [r for r in run.get("rollouts") or [] if r.get("outcome") is not None]
        if not include_errored:
            scored = [r for r in scored if r["outcome"] != "errored"]
        if unjudged is not None and run.get("noVerdict") and scored:
            unjudged.add(f"{run['envSlug']}@{run['envVersion']}")
        doc = await client.get_environment(run["envSlug"], run["envVersion"])
        spec = EnvironmentSpec.model_validate(doc.get("spec", doc))
        tools = await _task_tools(spec, sorted({int(r["taskIndex"]) for r in scored}))
        source = await _run_source(client, run_id)
        rows.extend(
            snapshot_row(r, run, spec.tasks, tools.get(int(r["taskIndex"]), []), source)
            for r in scored
        )
    if not rows:
        raise RolloutError(f"no scored rollouts to export in {', '.join(run_ids or [])}")
    # The buffer export's order, so both give byte-equal snapshots and training sets.
    rows.sort(key=lambda r: (r["run_id"], r["task_index"], r["sample_index"], r["rollout_id"]))
    return rows


# Rollouts asked of the buffer per page: each page's reply stays far below NATS' payload limit.
BUFFER_PAGE = 64


def buffer_row(item: Mapping[str, Any], tasks: list[Any]) -> dict[str, Any] | None:
    """One buffer `rollouts` item as a snapshot row (None: it has no trajectory to export)."""
    trajectory = item.get("trajectory")
    if not isinstance(trajectory, Mapping):
        return None
    index = int(item["task_index"])
    task = tasks[index] if index < len(tasks) else None
    messages = trajectory.get("messages") or []
    prompt = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    tools = item.get("tools") or []
    row = {
        "format": FORMAT,
        "rollout_id": item["rollout_id"],
        "run_id": item["run_id"],
        "task_index": index,
        "sample_index": int(item["sample_index"]),
        "task_id": task.id if task is not None else None,
        "split": task.split if task is not None else None,
        "model": item["model"],
        "policy_version": int(item["policy_version"]),
        "seed": item.get("seed"),
        "env_slug": item["env_slug"],
        "env_version": int(item["env_version"]),
        "env_hash": item["env_hash"],
        "score": item.get("score"),
        "passed": item.get("passed"),
        "outcome": item["outcome"],
        "error": item.get("error"),
        "error_kind": None,
        "primitives": json.dumps(item.get("primitives") or [], ensure_ascii=False),
        # Cut at a depth (as the tracker's reply is): json.dumps recurses.
        "trajectory": json.dumps(bounded(trajectory), ensure_ascii=False),
        "tools": json.dumps(tools, ensure_ascii=False) if tools else None,
        "prompt": prompt if isinstance(prompt, str) else None,
        "completion": trajectory.get("final_output"),
        "source": item.get("source"),
    }
    return _checked(row)


async def export_buffer_rows(
    client: Any, query: Any, *, unjudged: set[str] | None = None
) -> tuple[list[dict[str, Any]], int]:
    """(rows, skipped) for a buffer `RolloutsQuery`, asked a page at a time.

    `skipped` counts selected rollouts without a trajectory (a generation that never ran).
    `unjudged`, when given, gets the envs (`slug@version`) of the rows whose env judges
    nothing (`judges_nothing`): their verdicts say only that no tool call failed.
    The buffer answers once it has applied the events stream up to now (its last sequence when
    asked), so a verdict recorded before the export is never missing from it.
    """
    if query.after_seq is None:
        query = query.model_copy(
            update={"after_seq": await last_sequence(await client.jetstream())}
        )
    if query.as_of is None:
        # Every page sees the selection as of the export's start, not what is scored meanwhile.
        query = query.model_copy(update={"as_of": query.after_seq})
    items: list[dict[str, Any]] = []
    store = None
    while True:
        # Each page starts after the previous page's last rollout (keyset, not an offset).
        after = items[-1]["rollout_id"] if items else None
        page = query.model_copy(
            update={"offset": len(items), "page_size": BUFFER_PAGE, "after_rollout": after}
        )
        data = BufferData.model_validate(await client.request("buffer", "rollouts", page))
        # The stalest page's lag: `export` says so when the buffer's projection is stalled.
        client.read_models = worst(client.read_models, data.read_models)
        if data.ref is not None and store is None:
            store = object_store(client.settings)
        found, _ = await data.load(store)
        items.extend(found)
        if data.next_offset is None or not found:
            break
    if not items:
        raise RolloutError(
            "the buffer holds no scored rollouts that match",
            problems=["widen the selection (--env, --verdict, --policy-version, --since)"],
        )
    specs: dict[tuple[str, int], list[Any]] = {}
    empty: set[tuple[str, int]] = set()
    rows, skipped = [], 0
    for item in items:
        key = (item["env_slug"], int(item["env_version"]))
        if key not in specs:
            doc = await client.get_environment(*key)
            specs[key] = EnvironmentSpec.model_validate(doc.get("spec", doc)).tasks
            if judges_nothing(doc.get("spec", doc)):
                empty.add(key)
        row = buffer_row(item, specs[key])
        if row is None:
            skipped += 1
        else:
            rows.append(row)
            if unjudged is not None and key in empty:
                unjudged.add(f"{key[0]}@{key[1]}")
    if not rows:
        raise RolloutError(f"none of the {len(items)} selected rollouts has a trajectory")
    return rows, skipped


def lineage(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Where a snapshot's rows came from: runs, policy versions, envs and their hashes, verdicts."""
    outcomes: dict[str, int] = {}
    for row in rows:
        outcomes[row["outcome"]] = outcomes.get(row["outcome"], 0) + 1
    return {
        "rows": len(rows),
        "run_ids": sorted({r["run_id"] for r in rows}),
        "policy_versions": sorted({int(r["policy_version"]) for r in rows}),
        "envs": sorted({f"{r['env_slug']}@{r['env_version']}" for r in rows}),
        "env_hashes": sorted({r["env_hash"] for r in rows}),
        "models": sorted({r["model"] for r in rows}),
        "outcomes": dict(sorted(outcomes.items())),
        "sources": source_counts(r.get("source") for r in rows),
    }


def _is_earlier_export(folder: Path) -> bool:
    """FOLDER is a `--format hf` export: a save_to_disk folder of snapshot rows, nothing else."""
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        info = json.loads((folder / "dataset_info.json").read_text(encoding="utf-8"))
        shards = {f["filename"] for f in state["_data_files"]}
        columns = set(info["features"])
    except (OSError, ValueError, TypeError, KeyError):
        return False
    ours = {"state.json", "dataset_info.json"} | shards
    return (
        set(os.listdir(folder)) == ours
        and all((folder / name).is_file() and not (folder / name).is_symlink() for name in ours)
        and {"format", "rollout_id", "trajectory"} <= columns <= set(SnapshotRow.model_fields)
    )


def export_format(out: Path, fmt: str | None) -> str:
    """The export's format: --format as given, else the one --out's suffix names (jsonl for
    a name without a suffix, as before)."""
    if fmt is not None:
        return fmt
    suffix = out.suffix.lower()
    if suffix in FILE_FORMATS:
        return FILE_FORMATS[suffix]
    hint = "name a FILE.jsonl or FILE.parquet, or give --format (hf writes a save_to_disk folder)"
    if out.is_dir():
        raise RolloutError(
            f"--out {out}: is a folder, and no --format says what to write", problems=[hint]
        )
    if not suffix:
        return "jsonl"  # the format export always wrote when none was named
    raise RolloutError(f"--out {out}: unknown format {suffix!r}", problems=[hint])


def _is_earlier_jsonl(path: Path) -> bool:
    """PATH's first line is a snapshot row (`rollout export --format jsonl` wrote it)."""
    try:
        with path.open("rb") as f:
            row = json.loads(f.readline(FIRST_LINE_LIMIT))
    except (OSError, ValueError, RecursionError):
        return False
    return (
        isinstance(row, dict)
        and row.get("format") == FORMAT
        and {"rollout_id", "trajectory"} <= set(row) <= set(SnapshotRow.model_fields)
    )


def _is_earlier_parquet(path: Path) -> bool:
    """PATH is a parquet file of snapshot columns (`rollout export --format parquet` wrote it)."""
    import pyarrow.parquet as pq

    try:
        columns = set(pq.read_schema(path).names)
    except (OSError, ValueError):
        return False
    return {"format", "rollout_id", "trajectory"} <= columns <= set(SnapshotRow.model_fields)


def _free_name(out: Path) -> Path:
    """A name beside OUT that nothing holds yet (what an error suggests instead)."""
    for i in range(1, 1000):
        other = out.with_name(f"{out.stem}-{i}{out.suffix}")
        if not other.exists() and not other.is_symlink():
            return other
    return out.with_name(f"{out.stem}-{secrets.token_hex(4)}{out.suffix}")


def _check_export_file(out: Path, fmt: str) -> None:
    """Refuse a jsonl/parquet --out whose suffix says another format or that holds other data."""
    suffix = out.suffix.lower()
    named = FILE_FORMATS.get(suffix)
    if named is not None and named != fmt:
        # What import and load_dataset go by: parquet under a .jsonl name is read as JSON.
        raise RolloutError(
            f"--out {out}: a {suffix} name, but --format is {fmt}",
            problems=[
                f"name a FILE.{fmt} (e.g. --out {out.with_suffix('.' + fmt)}), "
                f"or leave --format out to write {named}"
            ],
        )
    earlier = _is_earlier_jsonl if fmt == "jsonl" else _is_earlier_parquet
    check_out_file(out, "--out", f"export --format {fmt}", earlier, what=f"{fmt} writes one file")


def check_out_file(
    out: Path, flag: str, command: str, earlier: Callable[[Path], bool], *, what: str
) -> None:
    """Refuse OUT unless it is missing, empty or what an earlier run of COMMAND wrote there
    (a folder, a link or the user's own file is never replaced)."""
    if out.is_symlink():
        raise RolloutError(f"{flag} {out}: is a symbolic link; name a real file")
    if not out.exists():
        return
    if out.is_dir():
        raise RolloutError(f"{flag} {out}: is a folder ({what})")
    try:
        info = out.stat()
    except OSError as exc:
        raise RolloutError(f"{flag} {out}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise RolloutError(f"{flag} {out}: is not a regular file; name a new file")
    # An empty file holds nothing to lose; an earlier output is replaced as it would be redone.
    if info.st_size == 0 or earlier(out):
        return
    raise RolloutError(
        f"{flag} {out}: exists and is not an earlier `rollout {command}`",
        problems=[
            f"nothing was written; choose another {flag} (e.g. {_free_name(out)}), "
            "or move the file away"
        ],
    )


def check_export_out(out: Path, fmt: str) -> None:
    """Refuse an --out that `write_snapshot` may not write (checked before anything runs)."""
    if fmt != "hf":
        _check_export_file(out, fmt)
        return
    if out.exists() and not out.is_dir():
        raise RolloutError(f"--out {out}: exists and is not a folder (hf writes a folder)")
    check_out_folder(out, "--out", "export --format hf", _is_earlier_export, new="dataset")


def write_snapshot(rows: list[dict[str, Any]], out: Path, fmt: str) -> Path:
    """Write rows as jsonl, parquet or a `save_to_disk` folder; all or nothing (tmp + rename)."""
    import datasets

    # The CLI says what it wrote in one line; datasets' bars are noise on stderr (and escaped).
    datasets.disable_progress_bars()
    check_export_out(out, fmt)
    final = out.resolve() if fmt == "hf" else out
    tmp = _staging_dir(final, f"--out {out}")
    try:
        if fmt == "jsonl":
            target = tmp / "rows.jsonl"
            with target.open("w", encoding="utf-8") as f:
                for i, row in enumerate(rows):
                    f.write(_json_line(row, f"--out {out}: row {i}"))
        else:
            dataset = datasets.Dataset.from_list(rows, features=_features())
            if fmt == "parquet":
                target = tmp / "rows.parquet"
                dataset.to_parquet(str(target))
            else:
                target = tmp / "dataset"
                dataset.save_to_disk(str(target))
        if fmt == "hf":
            # Again, just before: files may have been put in --out while the rows were written.
            check_export_out(out, fmt)
            _swap_in(target, final)
        else:
            # Again, just before: a file may have appeared at --out while these were written.
            check_export_out(out, fmt)
            os.replace(target, out)
    except OSError as exc:  # a full disk, a folder made read-only meanwhile
        raise RolloutError(
            f"--out {out}: cannot write there ({exc.strerror or exc})",
            problems=["nothing was replaced; choose an --out in a folder you can write to"],
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# --- output folders --------------------------------------------------------------------------


def check_out_folder(
    out: Path,
    flag: str,
    command: str,
    earlier: Callable[[Path], bool],
    *,
    inputs: Sequence[Path] = (),
    new: str = "out",
) -> None:
    """Refuse OUT unless it is missing, empty or what an earlier run of COMMAND wrote there.

    The folder is replaced as a whole, so anything else in it would be lost: it is named, and
    nothing is written or deleted. A folder holding an input or the current folder is refused.
    """
    if out.is_symlink():
        raise RolloutError(f"{flag} {out}: is a symbolic link; name a real folder")
    if not out.exists():
        return
    if not out.is_dir():
        raise RolloutError(f"{flag} {out}: exists and is not a folder")
    target = out.resolve()
    hint = f"nothing was written or deleted; name a new or empty folder, e.g. {flag} {out / new}"
    if Path.cwd().resolve().is_relative_to(target):
        raise RolloutError(f"{flag} {out}: is the current folder or holds it", problems=[hint])
    for source in inputs:
        if source.resolve().is_relative_to(target):
            raise RolloutError(f"{flag} {out}: holds the input {source}", problems=[hint])
    entries = sorted(os.listdir(target))
    if not entries or earlier(target):
        return
    shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
    raise RolloutError(
        f"{flag} {out}: not empty and not the output of an earlier `rollout {command}`",
        problems=[f"in the way: {shown}", hint],
    )


def _staging_dir(final: Path, where: str) -> Path:
    """A new empty folder beside FINAL to write into before the swap.

    Made by mkdir, not mkdtemp: it may become the output itself, so it gets the mode any
    folder the user makes gets (mkdtemp's is 0700).
    """
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{secrets.token_hex(4)}")
        tmp.mkdir()
    except OSError as exc:
        raise RolloutError(
            f"{where}: cannot write there ({exc.strerror or exc})",
            problems=["choose a place in a folder you can write to"],
        ) from None
    return tmp


def _swap_in(staged: Path, out: Path) -> None:
    """Put the fully written folder STAGED at OUT; an OUT already there is removed only after."""
    if not out.exists():
        os.replace(staged, out)
        return
    old = out.with_name(f".{out.name}.old-{secrets.token_hex(4)}")
    os.replace(out, old)
    try:
        os.replace(staged, out)
    except BaseException:
        os.replace(old, out)  # the earlier output stays as it was
        raise
    shutil.rmtree(old, ignore_errors=True)


def _json_line(item: Any, where: str) -> str:
    """ITEM as one JSON line; a NaN or infinity is refused (it is not JSON), never written."""
    try:
        return json.dumps(item, ensure_ascii=False, allow_nan=False) + "\n"
    except ValueError:
        raise RolloutError(
            f"{where}: holds a number that is not finite (NaN or infinity); nothing was written"
        ) from None


# --- import ----------------------------------------------------------------------------------


def _raw_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) for every row of PATH: a jsonl file, a parquet file or a save_to_disk dir."""
    if not path.exists():
        raise RolloutError(f"{path}: no such file or folder")
    if path.is_dir():
        import datasets

        try:
            dataset = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError) as exc:
            raise RolloutError(f"{path}: not a datasets save_to_disk folder ({exc})") from None
        if isinstance(dataset, datasets.DatasetDict):
            raise RolloutError(f"{path}: a DatasetDict; import one split's folder")
        return [(f"{path}: row {i}", row) for i, row in enumerate(dataset)]
    kind = FILE_FORMATS.get(path.suffix.lower())
    if kind is None:
        # `rollout export --out snap` writes jsonl (or parquet, with --format) under a name
        # without its suffix: such a file is read back by what it holds.
        kind = "jsonl" if _is_earlier_jsonl(path) else None
        kind = kind or ("parquet" if _is_earlier_parquet(path) else None)
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as exc:
            raise RolloutError(f"{path}: not a parquet file ({exc})") from None
        return [(f"{path}: row {i}", row) for i, row in enumerate(table.to_pylist())]
    if kind == "jsonl":
        return [(f"{path}:{number}", row) for number, row in read_jsonl(path)]
    raise RolloutError(
        f"{path}: unknown snapshot format",
        problems=["import a .jsonl or .parquet file or a save_to_disk folder (rollout export)"],
    )


def read_snapshot(path: Path) -> list[SnapshotRow]:
    """Every row of PATH, checked; the first bad one is named by file, row and field."""
    raw = _raw_rows(path)
    if not raw:
        raise RolloutError(f"{path}: no rows")
    if len(raw) > MAX_ROWS:
        raise RolloutError(f"{path}: more than {MAX_ROWS} rows")
    rows, seen = [], {}
    for where, data in raw:
        try:
            row = SnapshotRow.model_validate(data)
            problems = row_problems(row)
        except ValidationError as exc:
            problems = [
                f"{'.'.join(str(p) for p in e['loc']) or '(row)'}: {e['msg']}" for e in exc.errors()
            ]
            raise RolloutError(f"{where}: not a rollout snapshot row", problems=problems) from None
        except RecursionError:  # json.loads of a JSON text field nested thousands deep
            raise RolloutError(f"{where}: a JSON text field is nested too deeply") from None
        if problems:
            raise RolloutError(f"{where}: not a rollout snapshot row", problems=problems)
        if row.rollout_id in seen:
            raise RolloutError(f"{where}: rollout {row.rollout_id} repeats {seen[row.rollout_id]}")
        seen[row.rollout_id] = where
        rows.append(row)
    return rows


DATASET_PREFIX = "datasets"


async def stage_dataset(settings: Any, path: Path) -> Any:
    """Check every row of PATH, put its canonical JSONL in the object store; the job's source.

    Nothing is stored when a row is bad (named by file, row and field). The bytes are
    content-addressed, so staging the same dataset twice stores it once, under one hash.
    """
    rows = read_snapshot(path)
    data = canonical_jsonl(rows)
    sha = sha256_bytes(data)
    store = object_store(settings)
    ref = await store.put(content_key(DATASET_PREFIX, sha, ".jsonl"), data)
    return DatasetSource(
        uri=ref.uri, sha256=ref.sha256, size=ref.size, name=str(path), lineage=lineage_of(rows)
    )


def training_sets(rows: list[SnapshotRow], min_margin: float = 0.0) -> dict[str, list[dict]]:
    """SFT, DPO, KTO and GRPO rows from snapshot rows, as the buffer and learner build them."""
    if not (math.isfinite(min_margin) and min_margin >= 0):
        raise RolloutError(f"--min-margin must be a finite number >= 0, got {min_margin}")
    if not rows:  # every row held out (an export of a test run): nothing to build from
        return {"sft": [], "dpo": [], "kto": [], "grpo": []}
    buffer_rows = [r.buffer_row() for r in rows]
    run_ids = sorted({r.run_id for r in rows})
    sft_items, _, _ = sft_set(buffer_rows)
    pair_items, pair_meta, _ = dpo_pairs(buffer_rows, min_margin)
    labelled, _, _ = grpo_groups(
        buffer_rows, GrpoGroupsQuery(run_ids=run_ids, min_group_size=1, require_tokens=False)
    )
    grpo, _, _ = grpo_groups(buffer_rows, GrpoGroupsQuery(run_ids=run_ids, require_tokens=False))
    return {
        "sft": sft_rows(sft_items),
        "dpo": dpo_rows(TrainingSet(items=pair_items, meta=pair_meta)),
        "kto": kto_rows(labelled),
        "grpo": grpo,
    }


IMPORT_FILES = ("rollouts.jsonl", "sft.jsonl", "dpo.jsonl", "kto.jsonl", "grpo.jsonl")


def holds_exactly(files: Sequence[str]) -> Callable[[Path], bool]:
    """Whether a folder holds exactly FILES, plain files all (what a command wrote there, so
    it may be replaced)."""

    def check(folder: Path) -> bool:
        names = set(os.listdir(folder))
        return names == set(files) and all(
            (folder / name).is_file() and not (folder / name).is_symlink() for name in names
        )

    return check


# FOLDER holds exactly the files `import_snapshot` writes.
_is_earlier_import = holds_exactly(IMPORT_FILES)


def replace_folder(
    out: Path,
    files: Mapping[str, Sequence[Any]],
    command: str,
    earlier: Callable[[Path], bool],
    *,
    inputs: Sequence[Path] = (),
) -> None:
    """Write OUT/NAME.jsonl for each of FILES (JSON lines) in place of OUT, all or nothing; OUT
    is checked as `check_out_folder` does, before and again just before the swap."""
    check_out_folder(out, "-o", command, earlier, inputs=inputs, new="sets")
    final = out.resolve()
    tmp = _staging_dir(final, f"-o {out}")
    try:
        for name, items in files.items():
            with (tmp / f"{name}.jsonl").open("w", encoding="utf-8") as f:
                for i, item in enumerate(items):
                    f.write(_json_line(item, f"{out / name}.jsonl: item {i}"))
        # Checked again: the folder may have changed while the files were written.
        check_out_folder(out, "-o", command, earlier, inputs=inputs, new="sets")
        _swap_in(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def import_snapshot(
    path: Path, out: Path, *, min_margin: float = 0.0, include_held_out: bool = False
) -> dict[str, int]:
    """Check PATH, then write DIR/rollouts.jsonl and the training sets (all or nothing); rows
    of held-out tasks (a split other than train) stay out of the sets unless asked for."""
    check_out_folder(out, "-o", "import", _is_earlier_import, inputs=[path], new="sets")
    rows = read_snapshot(path)
    held = [] if include_held_out else [r for r in rows if r.split not in (None, "train")]
    kept = [r for r in rows if r.split in (None, "train")] if held else rows
    sets = training_sets(kept, min_margin)
    files = {"rollouts": [row.model_dump(mode="json") for row in rows], **sets}
    replace_folder(out, files, "import", _is_earlier_import, inputs=[path])
    counts = {name: len(items) for name, items in sets.items()}
    return {"rollouts": len(rows), **counts, "heldOut": len(held)}
