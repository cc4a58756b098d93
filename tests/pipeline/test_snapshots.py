"""`rollout export` / `rollout import` through the real CLI against in-process services on real
NATS + Postgres: a run's scored rollouts as jsonl, parquet and save_to_disk datasets with their
lineage, and back as the very training sets the buffer builds from the same run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import datasets
import pytest
from pipeline.kit import Platform, as_service, refund_env, wait_for_platform
from test_cli_platform import rollout

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.learner.training_sets import dpo_pairs, sft_set
from rollout.shared.aggregates.run import load_run_head
from rollout.shared.learning.trainer_rows import dpo_rows, sft_rows
from rollout.shared.settings import Settings, connect_nats
from rollout.snapshots import import_snapshot, read_snapshot


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
        code, stdout, err = await rollout(
            settings, "import", str(tmp_path / source), "-o", str(target)
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


async def test_export_errors_are_clear(client, settings, tmp_path) -> None:
    code, _, err = await rollout(settings, "export", "--run", "nope", "--out", str(tmp_path / "x"))
    assert code == 1 and "no run 'nope'" in err and "Traceback" not in err
    code, _, err = await rollout(settings, "export", "--env", "ghost", "--out", str(tmp_path / "x"))
    assert code == 1 and "'ghost' has no completed runs" in err


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
