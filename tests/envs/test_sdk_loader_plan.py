"""SDK classes, Task.from_jsonl, the loader's errors and the `rollout plan` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout import Environment, RolloutError, Task, primitive, verifier_config
from rollout.cli import main
from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.envs import load_environments

ROOT = Path(__file__).resolve().parents[2]
SEEDS = Path(__file__).parent / "seed_examples"


def test_task_accepts_snake_and_camel_case(tmp_path: Path) -> None:
    assert Task(instruction="a", hidden_ground_truth=1).hidden_ground_truth == 1
    assert Task(instruction="a", hiddenGroundTruth=2).hidden_ground_truth == 2
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"instruction": "a", "hidden_ground_truth": {"x": 1}, "split": "dev"}\n'
        "\n"
        '{"instruction": "b", "hiddenGroundTruth": {"x": 2}, "input": {"k": 1}, "id": "t2"}\n'
    )
    tasks = Task.from_jsonl(f)
    assert [(t.instruction, t.split, t.hidden_ground_truth) for t in tasks] == [
        ("a", "dev", {"x": 1}),
        ("b", "train", {"x": 2}),
    ]
    assert tasks[1].model_dump(by_alias=True)["hiddenGroundTruth"] == {"x": 2}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"instruction": "a"}\n{"instruction": ', ":2: not JSON: Expecting value at column 17"),
        ('["a"]', ":1: each line must be a JSON object"),
        ('{"instruction": "a", "answer": 1}', ":1: unknown key(s) ['answer']"),
        ('{"hidden_ground_truth": 1}', ":1: instruction: Field required"),
        # Latin-1 on line 2: the line, not "position 41" of the file.
        (
            '{"instruction": "a"}\n{"instruction": "caf\xe9"}\n'.encode("latin-1"),
            ":2: not UTF-8 text: byte 0xe9 at column 21 (save the file as UTF-8)",
        ),
    ],
)
def test_from_jsonl_errors_name_the_line(
    tmp_path: Path, content: str | bytes, message: str
) -> None:
    f = tmp_path / "t.jsonl"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content)
    with pytest.raises(RolloutError) as err:
        Task.from_jsonl(f)
    assert f"{f}{message}" in str(err.value)
    with pytest.raises(RolloutError, match="no such file"):
        Task.from_jsonl(tmp_path / "missing.jsonl")


def test_from_jsonl_reads_a_file_saved_with_a_bom_and_crlf(tmp_path: Path) -> None:
    # A Windows editor's UTF-8 file: "t.jsonl:1: invalid JSON: Unexpected UTF-8 BOM".
    f = tmp_path / "t.jsonl"
    f.write_bytes(b'\xef\xbb\xbf{"instruction": "a"}\r\n{"instruction": "b"}\r\n')
    assert [t.instruction for t in Task.from_jsonl(f)] == ["a", "b"]


def test_from_jsonl_keeps_unicode_line_separators_inside_a_line(tmp_path: Path) -> None:
    # JSON leaves U+2028/9 and NEL unescaped (json.dumps(ensure_ascii=False) writes them raw):
    # they were read as line ends, so a valid file was "t.jsonl:1: invalid JSON".
    text = "Refund O-1\u2028(sent from my phone)\u2029\x85thanks"
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"instruction": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [t.instruction for t in Task.from_jsonl(f)] == [text]


def test_spec_roundtrip_and_hash() -> None:
    (env,) = load_environments(SEEDS / "helpers_env.py")
    spec = env.to_spec()
    again = EnvironmentSpec.model_validate_json(spec.canonical_json())
    assert again == spec and again.spec_hash() == spec.spec_hash() == env.spec_hash()
    rebuilt = Environment.from_spec(spec.to_json_dict())
    assert rebuilt.to_spec().spec_hash() == spec.spec_hash()
    env.tasks[0].instruction = "changed"
    assert env.spec_hash() != spec.spec_hash()
    assert "hiddenGroundTruth" in spec.canonical_json()


def test_sdk_shapes() -> None:
    env = Environment(slug="db", template="sql", schema="CREATE TABLE t (x);", seed="")
    assert env.config == {"schema": "CREATE TABLE t (x);", "seed": ""}
    assert env.name == "db"
    p = primitive("c", "tool_was_called", tool="t", min_count=2, weight=2)
    assert p == {"name": "c", "type": "tool_was_called", "weight": 2, "tool": "t", "minCount": 2}
    assert verifier_config([p]) == verifier_config(p) == {"primitives": [p]}
    with pytest.raises(RolloutError) as err:
        Environment(slug="Bad Slug", template="workflow").to_spec()
    assert err.value.problems[0].startswith("slug: String should match pattern")


def write(tmp_path: Path, name: str, body: str) -> Path:
    f = tmp_path / name
    f.write_text(body)
    return f


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("from rollout import Environment\n\nenv = Environment(slug='x'\n", ":3: syntax error"),
        ("x = 1\n\n\nraise ValueError('boom')\n", ":4: ValueError: boom"),
        ("import surely_missing_pkg_abc\n", ":1: ModuleNotFoundError: No module named"),
        ("x = 1\n", "defines no Environment"),
        (
            "from rollout import Task\nTask.from_jsonl('nope.jsonl')\n",
            ":2: nope.jsonl: no such file",
        ),
    ],
)
def test_loader_errors_name_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    f = write(tmp_path, "env.py", body)
    with pytest.raises(RolloutError) as err:
        load_environments(f)
    assert str(f) in str(err.value) and message in str(err.value)


def test_loader_errors_in_a_module_the_env_file_imports_name_that_module(tmp_path: Path) -> None:
    # A syntax error of helper.py was said at the env file's path with helper's line number;
    # an exception raised in it named only the import line.
    write(tmp_path, "bad_helper.py", "X = 1\n\n\ndef f(:\n    pass\n")
    write(tmp_path, "raising_helper.py", "def boom():\n    return {}['k']\n\n\nV = boom()\n")
    syntax = write(tmp_path, "env.py", "import os\nimport bad_helper\n")
    with pytest.raises(RolloutError) as err:
        load_environments(syntax)
    assert err.value.message == (
        f"{tmp_path / 'bad_helper.py'}:4: syntax error: invalid syntax (imported at {syntax}:2)"
    )
    raising = write(tmp_path, "env2.py", "import raising_helper\n")
    with pytest.raises(RolloutError) as err:
        load_environments(raising)
    assert err.value.message == (
        f"{raising}:1: KeyError: 'k' (raised at {tmp_path / 'raising_helper.py'}:2)"
    )


def test_loader_errors_whose_message_cannot_be_read_or_is_huge(tmp_path: Path) -> None:
    # An exception whose __str__ raised escaped as a traceback; one of 200,000 characters was
    # printed whole.
    body = (
        "class E(Exception):\n    def __str__(self):\n        raise RuntimeError\n\n\nraise E()\n"
    )
    f = write(tmp_path, "env.py", body)
    with pytest.raises(RolloutError) as err:
        load_environments(f)
    assert err.value.message == f"{f}:6: E: (its message could not be read: RuntimeError)"
    f = write(tmp_path, "huge.py", "raise ValueError('x' * 200_000)\n")
    with pytest.raises(RolloutError) as err:
        load_environments(f)
    assert err.value.message == f"{f}:1: ValueError: {'x' * 2000}... (200,000 characters)"


def test_a_task_of_wrong_types_is_one_line_per_field(tmp_path: Path) -> None:
    body = "from rollout import Task\n\nt = Task(instruction=3, split=['a'])\n"
    f = write(tmp_path, "env.py", body)
    with pytest.raises(RolloutError) as err:
        load_environments(f)
    assert err.value.message == f"{f}:3: invalid Task: 2 problem(s)"
    assert err.value.problems == [
        "instruction: Input should be a valid string",
        "split: Input should be a valid string",
    ]
    assert "errors.pydantic.dev" not in str(err.value)


def test_environment_tasks_that_are_no_list_are_a_problem_by_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = "from rollout import Environment\n\nenv = Environment(slug='x', tasks=5)\n"
    f = write(tmp_path, "env.py", body)
    assert main(["plan", str(f)]) == 1
    out = capsys.readouterr().out
    assert "- tasks: Input should be a valid list" in out


def test_loader_finds_lists_and_resolves_relative_files(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"instruction": "a", "hidden_ground_truth": {}}\n')
    body = (
        "from rollout import Environment, Task\n"
        "tasks = Task.from_jsonl('t.jsonl')\n"
        "envs = [Environment(slug=f'e{i}', template='workflow', tasks=tasks) for i in range(2)]\n"
        "alias = envs[0]\n"
    )
    envs = load_environments(write(tmp_path, "many.py", body))
    assert [e.slug for e in envs] == ["e0", "e1"]
    with pytest.raises(RolloutError, match="no such file"):
        load_environments(tmp_path / "nope.py")


def test_plan_ok_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(SEEDS / "helpers_env.py")]) == 0
    out = capsys.readouterr().out
    assert "✓ refund-agent (workflow): 1 task(s)" in out and "tools: get_order, refund" in out
    assert main(["plan", str(SEEDS / "refund_agent.py"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and len(doc["environments"][0]["specHash"]) == 64


def test_plan_lists_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = (
        "from rollout import Environment, Task, primitive, verifier_config\n"
        "env = Environment(slug='bad', template='workflow', config={'tools': [\n"
        "    {'name': 'get', 'kind': 'lookup', 'fromArray': 'orderz', 'matchField': 'id'}],\n"
        "    'fixtures': {'orders': []}},\n"
        "    tasks=[Task(instruction='x', hidden_ground_truth={'refunds': []})],\n"
        "    verifier=verifier_config(primitive('p', 'tool_was_called', tool='gett')))\n"
        "ok = Environment(slug='ok', template='workflow', config={'tools': [{'name': 'm', 'kind': 'mock'}]},\n"
        "    tasks=[Task(instruction='x', hidden_ground_truth={})])\n"
    )
    f = write(tmp_path, "bad.py", body)
    assert main(["plan", str(f)]) == 1
    out = capsys.readouterr().out
    assert "✗ bad: 2 problem(s)" in out
    assert "config.tools[0].fromArray: no fixture 'orderz'" in out
    assert "verifier.primitives[0].tool: unknown tool 'gett' (tools: get)" in out
    assert "✓ ok (workflow)" in out
    assert main(["plan", str(f), "--slug", "ok"]) == 0
    capsys.readouterr()
    assert main(["plan", str(f), "--slug", "nope", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc == {
        "ok": False,
        "error": "no environment with slug 'nope' (found: 'bad', 'ok')",
        "problems": [],
    }


def test_plan_console_script_never_prints_a_traceback(tmp_path: Path) -> None:
    f = write(tmp_path, "broken.py", "def f(:\n")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "rollout"), "plan", str(f)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"{f}:1: syntax error" in proc.stderr


def test_plan_refuses_held_out_repeats_and_odd_split_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = (
        "from rollout import Environment, Task\n"
        "CFG = {'tools': [{'name': 'refund', 'kind': 'action', 'appendTo': 'refunds',\n"
        "    'value': {'order_id': '${args.order_id}'}}], 'initialMutableState': {'refunds': []}}\n"
        "GT = {'refunds': [{'order_id': 'O-1'}]}\n"
    )
    overlap = write(tmp_path, "overlap.py", head + (
        "env = Environment(slug='o', config=CFG, tasks=[\n"
        "    Task(instruction='Refund O-1 for Alice', hidden_ground_truth=GT, split='train'),\n"
        "    Task(instruction='Refund O-1 for Alice', hidden_ground_truth=GT, split='test')])\n"
    ))  # fmt: skip
    assert main(["plan", str(overlap)]) == 1
    out = capsys.readouterr().out
    assert "✗ o: 1 problem(s)" in out
    assert "tasks[1]: same instruction and ground truth as tasks[0] (train)" in out
    weird = write(tmp_path, "weird.py", head + (
        "env = Environment(slug='w', config=CFG, tasks=[\n"
        "    Task(instruction='Refund O-1', hidden_ground_truth=GT, split='Test '),\n"
        "    Task(instruction='Refund O-1 b', hidden_ground_truth=GT, split='')])\n"
    ))  # fmt: skip
    assert main(["plan", str(weird), "--json"]) == 1
    (report,) = json.loads(capsys.readouterr().out)["environments"]
    assert [p.split(":")[0] for p in report["problems"]] == ["tasks[0].split", "tasks[1].split"]
    near = write(tmp_path, "near.py", head + (
        "env = Environment(slug='n', config=CFG, tasks=[\n"
        "    Task(instruction='Refund O-1', hidden_ground_truth=GT),\n"
        "    Task(instruction='Refund O-2', hidden_ground_truth=GT, split='tset')])\n"
    ))  # fmt: skip
    assert main(["plan", str(near)]) == 0
    out = capsys.readouterr().out
    assert "! tasks[1].split: 'tset' is close to 'test'" in out
    assert "rollout audit" not in out  # the audit hint is for verifier warnings
    # --with means nothing for an env file: said, not ignored.
    assert main(["plan", str(near), "--with", "policy=local/scripted"]) == 1
    assert "--with: only for an experiment plan (.toml)" in capsys.readouterr().err


def test_plan_and_push_name_a_slug_that_is_no_string(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Both counted slugs to find duplicates: a dict slug raised TypeError (unhashable type).
    body = (
        "from rollout import Environment\n\n"
        "env = Environment(slug={'a': 1}, tasks=[{'instruction': 'x', 'hiddenGroundTruth': {}}])\n"
    )
    f = write(tmp_path, "env.py", body)
    assert main(["plan", str(f)]) == 1
    assert "    - slug: Input should be a valid string\n" in capsys.readouterr().out
    assert main(["push", str(f)]) == 1
    err = capsys.readouterr().err
    assert f"error: {f}: not pushed, fix these first" in err
    assert "{'a': 1}: slug: Input should be a valid string" in err


def test_a_lone_primitive_or_task_is_named_as_one_not_as_unknown_keys() -> None:
    # verifier=primitive(...) was three "verifier.name/type/weight: unknown key" problems;
    # tasks=Task(...) was iterated as its fields: seven "tasks[i]: Input should be a valid
    # dictionary" problems.
    task = Task(instruction="x", hidden_ground_truth={})
    env = Environment(slug="a", tasks=[task], verifier=primitive("p", "state_match"))
    assert env.validate() == [
        "verifier: one primitive, not a verifier: give a list of primitives "
        "(verifier_config(primitive(...)) or [primitive(...)])"
    ]
    env = Environment(slug="b", tasks=task)
    assert env.validate() == ["tasks: one task, not a list of them (tasks=[Task(...)])"]
    assert (
        Environment(slug="c", tasks=[task], verifier=[primitive("p", "state_match")]).validate()
        == []
    )
