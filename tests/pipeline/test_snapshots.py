"""`rollout export` / `rollout import` through the real CLI against in-process services on real
NATS + Postgres: a run's scored rollouts as jsonl, parquet and save_to_disk datasets with their
lineage, and back as the very training sets the buffer builds from the same run."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import datasets
import pytest
from pipeline.kit import Platform, as_service, refund_env, wait_for_platform
from test_cli_platform import rollout

from rollout.cli import main
from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.learner.training_sets import dpo_pairs, sft_set
from rollout.shared.aggregates.run import load_run_head
from rollout.shared.contracts.snapshot import SnapshotRow, canonical_jsonl, rows_from_jsonl
from rollout.shared.learning.trainer_rows import dpo_rows, sft_rows
from rollout.shared.settings import Settings, connect_nats
from rollout.snapshots import (
    IMPORT_FILES,
    export_format,
    import_snapshot,
    read_snapshot,
    write_snapshot,
)


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[AsyncClient]:
    """Registry, tracker, actor, verifier and the buffer in-process."""
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "verifier", "actor", "buffer"):
        platform.start(name)
    c = AsyncClient(settings, timeout_s=20)
    await wait_for_platform(c, platform)
    yield c
    await c.close()
    platform.check()
    await platform.stop_all()


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_export_then_import_rebuilds_the_buffers_training_sets(
    client, agent_server, settings, tmp_path
) -> None:
    await client.push_environment(refund_env(tasks=2))
    run = await client.create_run("refunds", f"{agent_server.base_url}#m", n=4, seed=1)
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert done["status"] == "completed" and done["scored"] == 8
    verdicts = {r["rolloutId"]: r for r in await client.get_rollouts(run["runId"], False)}

    loaded = {}
    for fmt, name in (("jsonl", "s.jsonl"), ("parquet", "s.parquet"), ("hf", "s_hf")):
        out = tmp_path / name
        code, stdout, err = await rollout(
            settings, "export", "--run", run["runId"], "--format", fmt, "--out", str(out)
        )
        assert code == 0, err
        assert f"8 rollouts of 1 run(s) -> {out} ({fmt})" in stdout
        if fmt == "hf":
            loaded[fmt] = datasets.load_from_disk(str(out))
        else:
            kind = "json" if fmt == "jsonl" else "parquet"
            loaded[fmt] = datasets.load_dataset(kind, data_files=str(out), split="train")
    for fmt, rows in loaded.items():
        assert rows.num_rows == 8, fmt
        assert sorted(rows["rollout_id"]) == sorted(verdicts), fmt
        for row in rows:  # the lineage and the verdict of every rollout
            ours = verdicts[row["rollout_id"]]
            assert row["run_id"] == run["runId"] and row["model"] == done["model"]
            assert (row["env_slug"], row["env_version"]) == ("refunds", 1)
            assert row["env_hash"] == done["envHash"] and row["policy_version"] == 0
            assert (row["score"], row["passed"]) == (ours["score"], ours["passed"])
            assert row["outcome"] == ours["outcome"] and row["seed"] == ours["seed"]
            names = [t["function"]["name"] for t in json.loads(row["tools"])]
            assert names == ["lookup_order", "refund"]
    assert loaded["hf"].features == loaded["parquet"].features
    # Exported again over the earlier export, the format taken from the suffix: replaced.
    code, stdout, err = await rollout(
        settings, "export", "--run", run["runId"], "--out", str(tmp_path / "s.parquet")
    )
    assert code == 0 and stdout.endswith("(parquet)\n"), err
    again = datasets.load_dataset("parquet", data_files=str(tmp_path / "s.parquet"), split="train")
    assert again.to_list() == loaded["parquet"].to_list()

    # What the buffer gives the learner for this run, asked as the learner asks it.
    nc = await connect_nats(as_service(settings, "learner"))
    try:
        ended = await load_run_head(nc.jetstream(), run["runId"])
        sft = await sft_set(nc, None, run["runId"], None, after_seq=ended.ended_seq)
        pairs = await dpo_pairs(
            nc, None, run["runId"], None, min_margin=0.0, after_seq=ended.ended_seq
        )
    finally:
        await nc.close()
    buffer_sft, buffer_dpo = sft_rows(sft.items), dpo_rows(pairs)
    assert buffer_sft and buffer_dpo

    for fmt, source in (("jsonl", "s.jsonl"), ("parquet", "s.parquet"), ("hf", "s_hf")):
        target = tmp_path / f"imported-{fmt}"
        # Every task, the held-out one (task 0, split test) included, as the buffer gives them.
        code, stdout, err = await rollout(
            settings, "import", str(tmp_path / source), "-o", str(target), "--include-held-out"
        )
        assert code == 0, err
        assert stdout.startswith("8 rollouts imported")
        assert _read_jsonl(target / "sft.jsonl") == buffer_sft, fmt
        assert _read_jsonl(target / "dpo.jsonl") == buffer_dpo, fmt
        kto = _read_jsonl(target / "kto.jsonl")
        assert sorted(r["label"] for r in kto) == sorted(v["passed"] for v in verdicts.values())
        grpo = _read_jsonl(target / "grpo.jsonl")
        assert [len(g["completions"]) for g in grpo] == [4, 4]
        # The imported sets open as datasets too (what a trainer loads).
        assert datasets.load_dataset("json", data_files=str(target / "sft.jsonl"), split="train")
    # By default the sets are the learner's: the held-out task's rollouts left out.
    assert {r["split"] for r in loaded["jsonl"]} == {"train", "test"}
    code, stdout, err = await rollout(
        settings, "import", str(tmp_path / "s.jsonl"), "-o", str(tmp_path / "learner")
    )
    held = sum(1 for r in loaded["jsonl"] if r["split"] == "test")
    assert code == 0 and f"left out {held} rollouts of held-out tasks" in stdout, (stdout, err)
    sft_train = _read_jsonl(tmp_path / "learner" / "sft.jsonl")
    assert sft_train and len(sft_train) < len(buffer_sft)


async def test_export_errors_are_clear(client, settings, tmp_path) -> None:
    out = str(tmp_path / "x.jsonl")
    code, _, err = await rollout(settings, "export", "--run", "nope", "--out", out)
    assert code == 1 and "no run 'nope'" in err and "Traceback" not in err
    code, _, err = await rollout(settings, "export", "--env", "ghost", "--out", out)
    assert code == 1 and "'ghost' has no completed runs" in err
    # A span past datetime's range was a traceback (OverflowError); numbers past the buffer's
    # 64-bit parse came back as "query.policy_versions.0: ... exceeded maximum size".
    buffer = ["export", "--buffer", "--env", "ghost", "--out", out]
    for flags, said in [
        (["--since", f"{10**20}h"], f"error: --since '{10**20}h': reaches back before the year 1"),
        (["--policy-version", str(10**20)], f"error: --policy-version {10**20}: no policy has"),
        (["--policy-version", "-1"], "error: --policy-version -1: no policy has that version"),
        (["--env-version", str(10**20)], f"error: --env-version {10**20}: no environment has"),
    ]:
        code, _, err = await rollout(settings, *buffer, *flags)
        assert code == 1 and err.startswith(said) and "Traceback" not in err, (flags, err)


async def test_export_from_the_buffer_selects_by_env_verdict_version_and_time(
    client, agent_server, settings, tmp_path
) -> None:
    model = f"{agent_server.base_url}#m"
    await client.push_environment(refund_env(tasks=2))
    await client.push_environment(refund_env(tasks=2, slug="other"))
    runs = []
    for slug, seed in (("refunds", 1), ("refunds", 2), ("other", 3)):
        run = await client.create_run(slug, model, n=4, seed=seed)
        done = await client.wait_for_run(run["runId"], timeout_s=120)
        assert done["status"] == "completed"
        runs.append(done)
    verdicts = {
        r["rolloutId"]: r for run in runs for r in await client.get_rollouts(run["runId"], False)
    }
    refunds = {i for i, r in verdicts.items() if r["runId"] in {runs[0]["runId"], runs[1]["runId"]}}
    failed = {i for i in refunds if verdicts[i]["passed"] is False}
    assert failed and failed != refunds  # the scripted agent fails some, not all

    async def export(*args: str) -> tuple[int, dict | str]:
        code, stdout, err = await rollout(settings, "export", "--buffer", *args, "--json")
        return code, json.loads(stdout) if code == 0 else err

    loaded = {}
    for fmt, name in (("jsonl", "b.jsonl"), ("parquet", "b.parquet"), ("hf", "b_hf")):
        out = tmp_path / name
        code, summary = await export("--env", "refunds", "--format", fmt, "--out", str(out))
        assert code == 0, summary
        assert summary["rows"] == 16 and summary["runs"] == sorted(r["runId"] for r in runs[:2])
        lineage = summary["lineage"]
        assert lineage["envs"] == ["refunds@1"] and lineage["policy_versions"] == [0]
        assert lineage["env_hashes"] == [runs[0]["envHash"]]
        assert lineage["outcomes"] == {"failed": len(failed), "passed": 16 - len(failed)}
        if fmt == "hf":
            loaded[fmt] = datasets.load_from_disk(str(out))
        else:
            kind = "json" if fmt == "jsonl" else "parquet"
            loaded[fmt] = datasets.load_dataset(kind, data_files=str(out), split="train")
    for fmt, rows in loaded.items():
        assert set(rows["rollout_id"]) == refunds, fmt
        for row in rows:
            ours = verdicts[row["rollout_id"]]
            assert (row["score"], row["passed"], row["seed"]) == (
                ours["score"], ours["passed"], ours["seed"]
            )  # fmt: skip
            assert row["env_hash"] == runs[0]["envHash"] and row["model"] == runs[0]["model"]
            assert json.loads(row["trajectory"])["messages"] and json.loads(row["tools"])

    # Round trip: the buffer's export imports as the run export of the same rollouts does.
    code, stdout, err = await rollout(
        settings, "export", "--run", runs[0]["runId"], "--run", runs[1]["runId"],
        "--out", str(tmp_path / "r.jsonl"),
    )  # fmt: skip
    assert code == 0, err
    sets = {}
    for source in ("b.jsonl", "b_hf", "r.jsonl"):
        target = tmp_path / f"in-{source}"
        code, stdout, err = await rollout(
            settings, "import", str(tmp_path / source), "-o", str(target)
        )
        assert code == 0 and stdout.startswith("16 rollouts imported"), err
        sets[source] = {n: (target / f"{n}.jsonl").read_text() for n in ("sft", "dpo", "kto")}
    assert sets["b.jsonl"] == sets["r.jsonl"] == sets["b_hf"]

    code, summary = await export(
        "--env", "refunds", "--verdict", "failed", "--out", str(tmp_path / "f.jsonl")
    )
    assert code == 0 and summary["rows"] == len(failed)
    got = datasets.load_dataset("json", data_files=str(tmp_path / "f.jsonl"), split="train")
    assert set(got["rollout_id"]) == failed and not any(got["passed"])
    code, summary = await export("--out", str(tmp_path / "all.jsonl"), "--since", "1h")
    assert code == 0 and summary["rows"] == 24  # every env, scored within the hour
    code, summary = await export("--env", "other", "--env-version", "1", "--policy-version", "0",
                                 "--out", str(tmp_path / "o.jsonl"))  # fmt: skip
    assert code == 0 and summary["runs"] == [runs[2]["runId"]]
    for args, message in (
        (("--policy-version", "1"), "the buffer holds no scored rollouts that match"),
        (("--since", "2999-01-01"), "the buffer holds no scored rollouts that match"),
        (("--env", "refunds", "--env-version", "2"), "no scored rollouts that match"),
        (("--since", "yesterday"), "--since 'yesterday': not a time"),
        (("--env-version", "1"), "--env-version: needs --env SLUG"),
    ):
        code, err = await export(*args, "--out", str(tmp_path / "x.jsonl"))
        assert code == 1 and message in err and "Traceback" not in err, (args, err)
        assert not (tmp_path / "x.jsonl").exists()
    code, _, err = await rollout(settings, "export", "--verdict", "passed", "--env", "refunds",
                                 "--out", str(tmp_path / "x.jsonl"))  # fmt: skip
    assert code == 1 and "--verdict: select from the buffer; add --buffer" in err


def _row(**change) -> dict:
    row = {
        "format": "rollout.snapshot/1", "rollout_id": "r1", "run_id": "run", "task_index": 0,
        "sample_index": 0, "model": "m", "policy_version": 0, "env_slug": "e",
        "env_version": 1, "env_hash": "h", "score": 1.0, "passed": True, "outcome": "passed",
        "primitives": "[]",
        "trajectory": json.dumps({"messages": [{"role": "user", "content": "hi"},
                                               {"role": "assistant", "content": "yo"}]}),
    }  # fmt: skip
    return {**row, **change}


def test_bad_snapshot_rows_are_refused_by_file_row_and_field_and_nothing_is_written(tmp_path):
    path = tmp_path / "bad.jsonl"
    out = tmp_path / "out"
    cases = [
        ([_row(), _row(rollout_id="r2", policy_version=-1)], ":2: not a rollout snapshot row",
         "policy_version"),
        ([_row(), _row(rollout_id="r2", trajectory="{}")], ":2:", "trajectory"),
        ([_row(outcome="maybe")], ":1:", "outcome"),
        ([_row(), _row()], ":2: rollout r1 repeats", ""),
        ([{**_row(), "extra": 1}], ":1:", "extra"),
    ]  # fmt: skip
    for rows, where, field in cases:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(RolloutError) as info:
            import_snapshot(path, out)
        text = str(info.value) + " ".join(info.value.problems or [])
        assert f"{path}{where}" in text and field in text, text
        assert not out.exists()  # all or nothing
    path.write_text("not json\n")
    with pytest.raises(RolloutError, match=r"bad.jsonl:1: not JSON"):
        read_snapshot(path)
    with pytest.raises(RolloutError, match="not a datasets save_to_disk folder"):
        read_snapshot(tmp_path)
    with pytest.raises(RolloutError, match="unknown snapshot format"):
        read_snapshot(path.rename(tmp_path / "rows.csv"))


# --- hostile input: output folders, verdicts, trajectories, encodings (offline, real CLI) -----


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """`rollout ARGS` in this process: (exit code, stdout, stderr)."""
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _write_rows(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _good(path: Path) -> Path:
    return _write_rows(
        path, _row(), _row(rollout_id="r2", score=0.0, passed=False, outcome="failed")
    )


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_import_refuses_a_folder_with_other_files_and_deletes_nothing(tmp_path, capsys) -> None:
    snap = _good(tmp_path / "good.jsonl")
    project = tmp_path / "myproject"
    project.mkdir()
    (project / "notes.txt").write_text("weeks of notes")
    (project / "sft.jsonl").write_text("my own sft data\n")  # one of its names is not enough
    before = _tree(tmp_path)
    code, out, err = _cli(capsys, "import", str(snap), "-o", str(project))
    assert code == 1 and out == "" and "Traceback" not in err
    assert f"-o {project}: not empty and not the output of an earlier `rollout import`" in err
    assert "in the way: notes.txt, sft.jsonl" in err and "name a new or empty folder" in err
    assert _tree(tmp_path) == before  # nothing deleted, nothing left behind
    assert sorted(os.listdir(tmp_path)) == ["good.jsonl", "myproject"]


def test_import_into_the_current_folder_or_one_holding_the_input_is_refused(
    tmp_path, capsys, monkeypatch
) -> None:
    work = tmp_path / "d"
    work.mkdir()
    _good(work / "snap.jsonl")
    (work / "keep.txt").write_text("keep")
    before = _tree(tmp_path)
    monkeypatch.chdir(work)
    for target in (".", "..", str(work)):
        code, _, err = _cli(capsys, "import", "snap.jsonl", "-o", target)
        assert code == 1 and f"-o {target}: is the current folder or holds it" in err, err
    monkeypatch.chdir(tmp_path)
    code, _, err = _cli(capsys, "import", "d/snap.jsonl", "-o", "d")
    assert code == 1 and "-o d: holds the input d/snap.jsonl" in err
    # An earlier import's folder that now holds the input is refused too.
    assert _cli(capsys, "import", "d/snap.jsonl", "-o", "sets")[0] == 0
    (tmp_path / "sets" / "snap.jsonl").write_bytes((work / "snap.jsonl").read_bytes())
    code, _, err = _cli(capsys, "import", "sets/snap.jsonl", "-o", "sets")
    assert code == 1 and "-o sets: holds the input sets/snap.jsonl" in err
    assert {k: v for k, v in _tree(tmp_path).items() if k.startswith("d/")} == before


def test_import_replaces_an_earlier_import_and_fills_an_empty_folder(tmp_path, capsys) -> None:
    snap = _good(tmp_path / "good.jsonl")
    sets = tmp_path / "sets"
    code, out, _ = _cli(capsys, "import", str(snap), "-o", str(sets), "--json")
    assert code == 0 and json.loads(out)["rollouts"] == 2
    mask = os.umask(0)
    os.umask(mask)
    # A normal folder, not mkdtemp's 0700.
    assert stat.S_IMODE(sets.stat().st_mode) == 0o777 & ~mask
    # A refused import leaves the earlier one as it was.
    first = _tree(sets)
    bad = _write_rows(tmp_path / "bad.jsonl", _row(score=float("nan")))
    assert _cli(capsys, "import", str(bad), "-o", str(sets))[0] == 1
    assert _tree(sets) == first
    bad.unlink()
    one = _write_rows(tmp_path / "one.jsonl", _row(rollout_id="only"))
    code, out, _ = _cli(capsys, "import", str(one), "-o", str(sets))
    assert code == 0 and out.startswith("1 rollouts imported")
    assert sorted(os.listdir(sets)) == sorted(IMPORT_FILES)
    assert [r["rollout_id"] for r in _read_jsonl(sets / "rollouts.jsonl")] == ["only"]
    assert stat.S_IMODE(sets.stat().st_mode) == 0o777 & ~mask
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _cli(capsys, "import", str(snap), "-o", str(empty))[0] == 0
    assert sorted(os.listdir(empty)) == sorted(IMPORT_FILES)
    # No staging or set-aside folder is left next to them.
    assert sorted(os.listdir(tmp_path)) == ["empty", "good.jsonl", "one.jsonl", "sets"]


def test_an_export_written_under_a_name_without_suffix_is_imported(tmp_path, capsys) -> None:
    # `rollout export --run RUN --format jsonl|parquet --out snap`, then `rollout import snap`
    # (README): the file has no suffix to say its format, so its content does.
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_row(), _row(rollout_id="r2", sample_index=1)]
    _write_rows(tmp_path / "snap", *rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "snap-parquet")
    for name in ("snap", "snap-parquet"):
        assert [r.rollout_id for r in read_snapshot(tmp_path / name)] == ["r1", "r2"]
        code, out, _ = _cli(capsys, "import", str(tmp_path / name), "-o", str(tmp_path / "o"))
        assert code == 0 and out.startswith("2 rollouts imported"), out
    (tmp_path / "notes").write_text("not a snapshot\n")
    with pytest.raises(RolloutError, match="unknown snapshot format"):
        read_snapshot(tmp_path / "notes")


def test_export_writes_no_progress_bars_to_stderr(tmp_path, capfd) -> None:
    every = dict.fromkeys(SnapshotRow.model_fields)  # as export_rows writes them: each field
    rows = [every | _row(), every | _row(rollout_id="r2", sample_index=1)]
    for fmt, name in (("parquet", "snap.parquet"), ("hf", "snap-hf")):
        write_snapshot(rows, tmp_path / name, fmt)
        assert capfd.readouterr().err == "", fmt  # "Creating parquet from Arrow format: 0%|"


def test_import_leaves_held_out_tasks_out_of_the_training_sets(tmp_path, capsys) -> None:
    # An export of a run on every task carries the test task's rollouts; the sets import builds
    # are for training, so they leave them out as the learner does (they went into sft.jsonl).
    rows = [
        _row(rollout_id="r1", task_index=0, split="train"),
        _row(rollout_id="r2", task_index=1, split="test"),
        _row(rollout_id="r3", task_index=2),  # an export from before splits: kept
    ]
    snap = _write_rows(tmp_path / "snap.jsonl", *rows)
    code, out, _ = _cli(capsys, "import", str(snap), "-o", str(tmp_path / "sets"))
    assert code == 0 and "left out 1 rollouts of held-out tasks from the sets" in out, out
    assert len(_read_jsonl(tmp_path / "sets" / "rollouts.jsonl")) == 3
    assert len(_read_jsonl(tmp_path / "sets" / "sft.jsonl")) == 2
    code, out, _ = _cli(
        capsys, "import", str(snap), "-o", str(tmp_path / "all"), "--include-held-out", "--json"
    )
    assert code == 0 and json.loads(out)["heldOut"] == 0 and json.loads(out)["sft"] == 3


def test_export_hf_replaces_only_an_earlier_hf_export(tmp_path) -> None:
    rows = [SnapshotRow.model_validate(r).model_dump() for r in (_row(), _row(rollout_id="r2"))]
    target = tmp_path / "exp"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    with pytest.raises(RolloutError, match="not the output of an earlier `rollout export") as info:
        write_snapshot(rows, target, "hf")
    assert "in the way: keep.txt" in info.value.problems[0]
    assert os.listdir(target) == ["keep.txt"]
    other = tmp_path / "other"
    datasets.Dataset.from_list([{"text": "someone else's dataset"}]).save_to_disk(str(other))
    with pytest.raises(RolloutError, match=f"--out {other}: not empty"):
        write_snapshot(rows, other, "hf")
    assert datasets.load_from_disk(str(other))["text"] == ["someone else's dataset"]
    out = tmp_path / "hf"
    write_snapshot(rows, out, "hf")
    write_snapshot(rows[:1], out, "hf")  # an earlier export is replaced
    assert [r.rollout_id for r in read_snapshot(out)] == ["r1"]
    assert sorted(os.listdir(tmp_path)) == ["exp", "hf", "other"]


def test_export_files_replace_only_earlier_exports_of_the_format_their_suffix_names(
    tmp_path, capsys
) -> None:
    rows = [SnapshotRow.model_validate(r).model_dump() for r in (_row(), _row(rollout_id="r2"))]
    work = tmp_path / "w"
    work.mkdir()
    # Someone's data: a generate output, a plan, a parquet file of other columns.
    generated = work / "gen.jsonl"
    generated.write_text(
        "".join(json.dumps({"id": str(i), "rollout_id": f"g{i}", "run_id": "r"}) + "\n"
                for i in range(3))
    )  # fmt: skip
    plan = work / "plan.toml"
    plan.write_text('name = "p1"\n')
    other = work / "other.parquet"
    datasets.Dataset.from_list([{"text": "someone else's rows"}]).to_parquet(str(other))
    before = _tree(work)
    for out, fmt in ((generated, "jsonl"), (plan, "jsonl"), (plan, "parquet"), (other, "parquet")):
        with pytest.raises(RolloutError) as info:
            write_snapshot(rows, out, fmt)
        assert f"--out {out}: exists and is not an earlier `rollout export --format {fmt}`" in (
            info.value.message
        )
        assert "nothing was written; choose another --out (e.g. " in info.value.problems[0]
    # The CLI refuses before it connects (there is no stack here).
    for args, message in (
        (("--format", "parquet", "--out", str(generated)),
         f"--out {generated}: a .jsonl name, but --format is parquet"),
        (("--format", "jsonl", "--out", str(work / "n.parquet")), "a .parquet name, but --format is jsonl"),
        (("--out", str(generated)), "exists and is not an earlier `rollout export --format jsonl`"),
        (("--format", "jsonl", "--out", str(plan)), "exists and is not an earlier `rollout export"),
        (("--out", str(plan)), f"--out {plan}: unknown format '.toml'"),
        (("--out", str(work)), f"--out {work}: is a folder, and no --format says what to write"),
        (("--format", "jsonl", "--out", str(work)), f"--out {work}: is a folder (jsonl writes one"),
    ):  # fmt: skip
        code, stdout, err = _cli(capsys, "export", "--run", "r1", *args)
        assert code == 1 and stdout == "" and message in err and "Traceback" not in err, (args, err)
    assert _tree(work) == before  # nothing written, nothing replaced
    assert sorted(os.listdir(work)) == ["gen.jsonl", "other.parquet", "plan.toml"]

    # A name without a suffix is jsonl, as export always wrote when no --format was named.
    assert export_format(work / "snap", None) == "jsonl"
    # An empty file or an earlier export of the same format is replaced; the suffix names it.
    for name in ("s.jsonl", "s.parquet"):
        out = work / name
        out.touch()
        fmt = export_format(out, None)
        assert fmt == name.split(".")[1]
        write_snapshot(rows, out, fmt)
        write_snapshot(rows[:1], out, fmt)
        assert [r.rollout_id for r in read_snapshot(out)] == ["r1"]
    # A jsonl export is not replaced by a parquet one (nor the other way round).
    odd = work / "s.data"
    write_snapshot(rows, odd, "jsonl")
    with pytest.raises(RolloutError, match="not an earlier `rollout export --format parquet`"):
        write_snapshot(rows, odd, "parquet")
    assert sorted(os.listdir(work)) == sorted(
        ["gen.jsonl", "other.parquet", "plan.toml", "s.jsonl", "s.parquet", "s.data"]
    )  # no staging folder left behind
    link = work / "l.jsonl"
    link.symlink_to(work / "s.jsonl")
    with pytest.raises(RolloutError, match="is a symbolic link"):
        write_snapshot(rows, link, "jsonl")
    with pytest.raises(RolloutError, match=r"--out /proc/snap.jsonl: cannot write there \("):
        write_snapshot(rows, Path("/proc/snap.jsonl"), "jsonl")


def test_non_finite_scores_and_margins_are_refused(tmp_path, capsys) -> None:
    out = tmp_path / "s"
    for score, shown in ((float("nan"), "nan"), (float("inf"), "inf")):
        path = _write_rows(tmp_path / "nan.jsonl", _row(score=score))
        code, _, err = _cli(capsys, "import", str(path), "-o", str(out))
        assert code == 1 and "Traceback" not in err
        assert f"{path}:1: not a rollout snapshot row" in err
        assert f"score: must be a finite number, got {shown}" in err
    path = _write_rows(tmp_path / "big.jsonl", _row(score=2.0))
    assert (
        "score: must be in [0, 1], got 2.0" in _cli(capsys, "import", str(path), "-o", str(out))[2]
    )
    # A NaN inside the trajectory (here a logprob) is named by its path.
    trajectory = json.dumps({"messages": [{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "yo"}],
                             "token_ids": [[1]], "logprobs": [[float("nan")]]})  # fmt: skip
    path = _write_rows(tmp_path / "lp.jsonl", _row(trajectory=trajectory))
    err = _cli(capsys, "import", str(path), "-o", str(out))[2]
    assert "trajectory.logprobs[0][0]: must be a finite number" in err
    good = _good(tmp_path / "good.jsonl")
    for margin in ("nan", "inf", "-1"):
        code, _, err = _cli(capsys, "import", str(good), "-o", str(out), "--min-margin", margin)
        assert code == 1 and "--min-margin must be a finite number >= 0" in err, err
    assert not out.exists()  # nothing written


def test_contradictory_verdicts_are_refused_by_file_row_and_field(tmp_path, capsys) -> None:
    out = tmp_path / "s"
    cases = [
        (_row(score=0.0, passed=True, outcome="failed"), "passed: true contradicts outcome 'failed'"),
        (_row(passed=False, outcome="passed"), "passed: false contradicts outcome 'passed'"),
        (_row(passed=True, outcome="errored"), "passed: true contradicts outcome 'errored'"),
        (_row(passed=None, outcome="failed", score=0.0), "passed: missing; outcome 'failed'"),
        (_row(score=None), "score: missing; a passed row has a score"),
    ]  # fmt: skip
    for bad, problem in cases:
        path = _write_rows(tmp_path / "contra.jsonl", _row(rollout_id="ok"), bad)
        code, _, err = _cli(capsys, "import", str(path), "-o", str(out))
        assert code == 1 and f"{path}:2: not a rollout snapshot row" in err and problem in err, err
    assert not out.exists()
    # An errored row has no verdict: passed false or null, any score or none, is taken.
    path = _write_rows(tmp_path / "errored.jsonl",
                       _row(outcome="errored", passed=None, score=None, error="model down"),
                       _row(rollout_id="r2", outcome="errored", passed=False, score=0.0))  # fmt: skip
    assert _cli(capsys, "import", str(path), "-o", str(out))[0] == 0


def test_an_import_of_held_out_rows_only_writes_them_and_empty_sets(tmp_path, capsys) -> None:
    # An export of a run on the test split: every row is held out. The import raised a
    # pydantic ValidationError (a traceback) building GRPO groups of no runs.
    snap = _write_rows(
        tmp_path / "test-run.jsonl",
        _row(rollout_id="r1", split="test"),
        _row(rollout_id="r2", task_index=1, split="test", score=0.0, passed=False,
             outcome="failed"),
    )  # fmt: skip
    code, out, err = _cli(capsys, "import", str(snap), "-o", str(tmp_path / "sets"), "--json")
    assert code == 0 and "Traceback" not in err, err
    counts = {k: v for k, v in json.loads(out).items() if k != "out"}
    assert counts == {"rollouts": 2, "sft": 0, "dpo": 0, "kto": 0, "grpo": 0, "heldOut": 2}
    assert len(_read_jsonl(tmp_path / "sets" / "rollouts.jsonl")) == 2
    assert all((tmp_path / "sets" / f"{name}.jsonl").read_text() == ""
               for name in ("sft", "dpo", "kto", "grpo"))  # fmt: skip


def test_text_with_unicode_line_separators_reaches_the_learner_in_one_row(tmp_path) -> None:
    # JSON leaves U+2028/9 and NEL unescaped (canonical_jsonl writes them raw); the learner read
    # the staged bytes with str.splitlines, which cut such a row in two: a dataset `import`
    # and `improve --dataset` accepted failed its job with "Invalid JSON: EOF while parsing".
    text = "refund it\u2028(sent from my phone)\u2029\x85done"
    trajectory = json.dumps({"messages": [{"role": "user", "content": text},
                                          {"role": "assistant", "content": "yo"}]},
                            ensure_ascii=False)  # fmt: skip
    path = tmp_path / "snap.jsonl"
    path.write_text(
        json.dumps(_row(trajectory=trajectory), ensure_ascii=False) + "\n"
        + json.dumps(_row(rollout_id="r2", prompt=text), ensure_ascii=False) + "\n",
        encoding="utf-8",
    )  # fmt: skip
    rows = read_snapshot(path)
    staged = canonical_jsonl(rows)
    assert "\u2028".encode() in staged  # raw, as the learner gets them
    assert rows_from_jsonl(staged, "ds") == rows
    assert json.loads(rows[0].trajectory)["messages"][0]["content"] == text


def test_staged_rows_written_past_the_cli_are_checked_alike_where_the_learner_reads_them() -> None:
    good = json.dumps(_row()) + "\n"
    assert len(rows_from_jsonl(good.encode(), "ds")) == 1
    bad = _row(rollout_id="r2", trajectory=json.dumps(
        {"messages": [{"role": "user", "content": "hi"},
                      {"role": "assistant", "content": None, "tool_calls": "bad"}]}))  # fmt: skip
    for row, problem in (
        (_row(rollout_id="r2", score=0.0, outcome="failed"), "passed: true contradicts"),
        (bad, "trajectory.messages[1].tool_calls: must be a list of calls"),
    ):
        with pytest.raises(ValueError, match="ds:2: ") as caught:
            rows_from_jsonl((good + json.dumps(row) + "\n").encode(), "ds")
        assert problem in str(caught.value)


def test_a_snapshot_saved_with_a_bom_and_crlf_is_read(tmp_path) -> None:
    # A Windows editor's save: line 1 was "not JSON (Unexpected UTF-8 BOM ...)".
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_row()).encode() + b"\r\n")
    assert [r.rollout_id for r in read_snapshot(path)] == [_row()["rollout_id"]]


def test_non_utf8_snapshot_is_named_not_a_traceback(tmp_path, capsys) -> None:
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b"\xff\xfe\x00binary")
    code, _, err = _cli(capsys, "import", str(path), "-o", str(tmp_path / "s"))
    assert code == 1 and "Traceback" not in err
    assert f"{path}:1: not UTF-8 text: byte 0xff at column 1" in err
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(_row()).encode() + b"\n" + b'{"model": "caf\xe9"}\n')
    with pytest.raises(RolloutError) as info:
        read_snapshot(latin)
    assert f"{latin}:2: not UTF-8 text: byte 0xe9 at column 15" in str(info.value)


def test_malformed_trajectory_messages_are_named_by_path(tmp_path, capsys) -> None:
    user = {"role": "user", "content": "hi"}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

    def assistant(**fields) -> dict:
        return {"role": "assistant", "content": None, **fields}

    cases = [
        ([user, assistant(tool_calls="bad")],
         "trajectory.messages[1].tool_calls: must be a list of calls"),
        ([user, assistant(tool_calls={"function": {}})],
         "trajectory.messages[1].tool_calls: must be a list of calls"),
        ([user, assistant(tool_calls=["x"])], "trajectory.messages[1].tool_calls[0]: must be a call"),
        ([user, assistant(tool_calls=[{"id": "c1", "function": "f"}])],
         "trajectory.messages[1].tool_calls[0].function: must be"),
        ([user, assistant(tool_calls=[{"id": "c1", "function": {"name": 3}}])],
         "trajectory.messages[1].tool_calls[0].function.name: must be a string"),
        ([user, assistant(tool_calls=[{**call, "function": {"name": "f", "arguments": [1]}}])],
         "trajectory.messages[1].tool_calls[0].function.arguments: must be JSON text or an object"),
        ([{**user, "tool_calls": [call]}, assistant(content="yo")],
         "trajectory.messages[0].tool_calls: only an assistant message calls tools"),
        ([{"content": "hi"}, assistant(content="yo")], "trajectory.messages[0].role: must be one of"),
        ([{"role": "user", "content": ["hi"]}, assistant(content="yo")],
         "trajectory.messages[0].content: must be a string, got list"),
    ]  # fmt: skip
    out = tmp_path / "s"
    for messages, problem in cases:
        trajectory = json.dumps({"messages": messages})
        path = _write_rows(tmp_path / "trajtools.jsonl", _row(trajectory=trajectory))
        code, _, err = _cli(capsys, "import", str(path), "-o", str(out))
        assert code == 1 and "Traceback" not in err, err
        assert f"{path}:1: not a rollout snapshot row" in err and problem in err, (problem, err)
    assert not out.exists()
    # The tools the builders copy into every example, and JSON text nested past any reader.
    path = _write_rows(tmp_path / "tools.jsonl", _row(tools=json.dumps([[{"type": "function"}]])))
    err = _cli(capsys, "import", str(path), "-o", str(out))[2]
    assert f"{path}:1: not a rollout snapshot row" in err and "tools[0]: must be an OpenAI" in err
    path = _write_rows(tmp_path / "deep.jsonl", _row(tools="[" * 5000 + "]" * 5000))
    err = _cli(capsys, "import", str(path), "-o", str(out))[2]
    assert f"{path}:1: a JSON text field is nested too deeply" in err
    assert not out.exists()
    # What the platform records is taken: a call the model could not name or give JSON for
    # (kept with an empty name and its raw text), its tool result, an assistant that said nothing.
    broken = {"id": "c1", "type": "function", "function": {"name": "", "arguments": "{oops"}}
    messages = [user, assistant(tool_calls=[broken]),
                {"role": "tool", "tool_call_id": "c1", "name": "", "content": "error"},
                assistant(content=None)]  # fmt: skip
    path = _write_rows(tmp_path / "ok.jsonl", _row(trajectory=json.dumps({"messages": messages})))
    assert _cli(capsys, "import", str(path), "-o", str(out))[0] == 0
    [example] = _read_jsonl(out / "sft.jsonl")
    assert example["messages"][1]["tool_calls"][0]["function"]["arguments"] == "{oops"


async def test_a_tool_result_nested_2000_deep_is_exported_cut(client, settings, tmp_path) -> None:
    # A tool result is the env's and can be shaped by the model: one nested 2,000 deep made
    # the tracker's json.loads raise RecursionError, and the export (and the run's reply) with it.
    from datetime import UTC, datetime

    from rollout.shared.store.db import create_pool

    await client.push_environment(refund_env(tasks=1))
    deep = '{"inner": ' * 2_000 + '"bottom"' + "}" * 2_000
    raw = (
        '{"messages": [{"role": "user", "content": "Refund order O-0"}],'
        f' "tool_calls": [{{"index": 0, "name": "refund", "arguments": {{}}, "result": {deep}}}],'
        ' "final_output": "done"}'
    )
    pool = await create_pool(settings.database_url)
    try:
        now = datetime.now(UTC)
        await pool.execute(
            "insert into runs(run_id, env_slug, env_version, env_hash, model, n, sampling,"
            " max_tool_calls, policy_version, status, total, scored, passed, created_at)"
            " values ('deep', 'refunds', 1, 'h', 'm', 1, '{}', 4, 0, 'completed', 1, 1, 1, $1)",
            now,
        )  # fmt: skip
        await pool.execute(
            "insert into rollouts(rollout_id, run_id, task_index, sample_index, status, model,"
            " policy_version, score, passed, generated_at, scored_at, primitives, trajectory)"
            " values ('deep-0', 'deep', 0, 0, 'scored', 'm', 0, 1.0, true, $1, $1, '[]',"
            " $2::jsonb)",
            now, raw,
        )  # fmt: skip
    finally:
        await pool.close()
    out = tmp_path / "deep.jsonl"
    code, _, err = await rollout(settings, "export", "--run", "deep", "--out", str(out))
    assert code == 0, err
    [row] = _read_jsonl(out)
    result = json.loads(row["trajectory"])["tool_calls"][0]["result"]
    levels = 0
    while isinstance(result, dict):
        result, levels = result["inner"], levels + 1
    # The trajectory, its calls, the call and the result take 4 of the 64 levels.
    assert levels == 64 - 4 + 1
    assert result.startswith('[cut at depth 64] {"inner":')
