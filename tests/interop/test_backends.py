"""The seed's surface: the closed allow-list, name and rollout_func rules, `backends list`."""

from __future__ import annotations

import json

import pytest

from rollout.cli import main
from rollout.errors import RolloutError
from rollout.shared.interop import backends
from rollout.shared.interop.rollout_func import (
    MAX_ROLLOUT_FUNC_LEN,
    launch_rollout,
    normalise_rows,
    validate_rollout_func,
)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "must be a string, got bool"),
        (7, "must be a string, got int"),
        ("", "must be a non-empty string"),
        ("open\x00env", "must not contain null bytes"),
        ("x" * 33, "exceeds 32 chars"),
        ("trl", "is not supported. Valid: ['art', 'nemo_gym', 'openenv', 'ruler', 'verifiers']"),
    ],
)
def test_backend_name_rules(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        backends.validate_backend_name(value)


def test_backend_name_is_normalised() -> None:
    assert backends.validate_backend_name("OpenEnv") == "openenv"
    assert backends.get_backend("ART").requires[0].pip == "openpipe-art"


def test_the_allow_list_is_closed() -> None:
    with pytest.raises(TypeError):
        backends.BACKENDS["mine"] = backends.BACKENDS["art"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (False, "must be a string, got bool"),
        (3.5, "must be a string, got float"),
        ("", "must not be empty"),
        ("m:f\x00", "must not contain null bytes"),
        ("m" * MAX_ROLLOUT_FUNC_LEN + ":f", f"must be <= {MAX_ROLLOUT_FUNC_LEN} chars"),
        ("no_colon", "must match 'module.path:function_name'"),
        ("a.b:c.d", "must match 'module.path:function_name'"),
        ("os;rm:f", "must match 'module.path:function_name'"),
    ],
)
def test_rollout_func_shape_rules(value: object, message: str) -> None:
    with pytest.raises(RolloutError, match=message):
        validate_rollout_func(value)
    # The same rules guard launch_rollout, before anything is imported.
    with pytest.raises(RolloutError, match=message):
        launch_rollout(["p"], value)


def test_rollout_func_none_passes_validation_but_not_launch() -> None:
    assert validate_rollout_func(None) is None
    with pytest.raises(RolloutError, match="requires training.rollout_func"):
        launch_rollout(["p"], None)


def test_rollout_func_only_for_openenv() -> None:
    with pytest.raises(RolloutError, match="'openenv' backend's protocol"):
        launch_rollout(["p"], "m:f", backend="art")


# ---------------------------------------------------------------- resolution, in a plugin host


def test_module_not_importable(user_module) -> None:
    with pytest.raises(RolloutError, match="module 'no_such_mod_xyz' could not be imported"):
        launch_rollout(["p"], "no_such_mod_xyz:make")


def test_attribute_missing(user_module) -> None:
    user_module("rf_attr", "def make(prompts):\n    return []\n")
    with pytest.raises(RolloutError, match="module 'rf_attr' has no attribute 'other'"):
        launch_rollout(["p"], "rf_attr:other")


def test_attribute_not_callable(user_module) -> None:
    user_module("rf_notcall", "make = 42\n")
    with pytest.raises(RolloutError, match=r"resolved attribute is not callable \(int\)"):
        launch_rollout(["p"], "rf_notcall:make")


def test_result_not_iterable(user_module) -> None:
    user_module("rf_noiter", "def make(prompts):\n    return 5\n")
    with pytest.raises(RolloutError, match="must return an iterable of row mappings, got int"):
        launch_rollout(["p"], "rf_noiter:make")


def test_rows_are_normalised_and_payloads_dropped(user_module) -> None:
    user_module(
        "rf_good",
        """
        import os
        def make(prompts):
            # The function runs in the sandbox, not in this process.
            rows = [{"prompt": p.upper(), "answer": "4", "secret": "x", "pid": os.getpid()}
                    for p in prompts]
            rows.append({"prompt": [{"role": "user", "content": "hi", "extra": 1}]})
            return (r for r in rows)
        """,
    )
    result = launch_rollout(["two plus two", "2+2"], "rf_good:make")
    assert result.backend == "openenv"
    assert result.grpo_prompts() == [
        {"prompt": "TWO PLUS TWO", "answer": "4"},
        {"prompt": "2+2", "answer": "4"},
        {"prompt": [{"role": "user", "content": "hi"}]},
    ]


def test_rollout_func_does_not_run_in_this_process(user_module, tmp_path) -> None:
    marker = tmp_path / "ran-here"
    user_module(
        "rf_escape",
        f"""
        def make(prompts):
            open({str(marker)!r}, "w").write("x")
            return [{{"prompt": "p"}}]
        """,
    )
    with pytest.raises(RolloutError):
        launch_rollout(["p"], "rf_escape:make")
    assert not marker.exists()  # the sandbox's file system is not ours


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return [1]", "rollout row 0 must be a mapping, got int"),
        ("return [{'prompt': ''}]", "rollout row 0 has an empty prompt"),
        ("return [{'prompt': []}]", "rollout row 0 has an empty prompt"),
        ("return [{'prompt': 3}]", r"must carry a 'prompt' \(str or message list\), got int"),
        ("return [{'prompt': 'p', 'answer': 4}]", "'answer' must be a string, got int"),
        ("return [{'prompt': 'p'}] * 6", "produced more than 5 rows"),
        ("return []", "produced no rows"),
    ],
)
def test_row_rules_through_the_host(user_module, body: str, message: str) -> None:
    name = user_module(f"rf_rows_{abs(hash(body))}", f"def make(prompts):\n    {body}\n")
    with pytest.raises(RolloutError, match=message):
        launch_rollout(["p"], f"{name}:make", limit=5)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "got NoneType"),
        ("rows", "got str"),
        ({"prompt": "p"}, "got dict"),
        ([object()], "row 0 must be a mapping, got object"),
        ([{"prompt": "p", "answer": None}, {"prompt": "q", "answer": b"x"}], "got bytes"),
    ],
)
def test_normalise_rows_rules(raw: object, message: str) -> None:
    with pytest.raises(RolloutError, match=message):
        normalise_rows(raw)


def test_normalise_rows_copies_messages() -> None:
    messages = [{"role": "user", "content": "hi"}]
    rows = normalise_rows([{"prompt": messages}])
    messages[0]["content"] = "changed"
    assert rows[0]["prompt"][0]["content"] == "hi"


# ---------------------------------------------------------------- CLI and missing packages


def test_backends_list_json(capsys) -> None:
    assert main(["backends", "list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [b["name"] for b in doc["backends"]]
    assert names == ["art", "nemo_gym", "openenv", "ruler", "verifiers"]
    openenv = next(b for b in doc["backends"] if b["name"] == "openenv")
    assert openenv["requires"] == [{"pip": "openenv-core", "module": "openenv", "installed": True}]
    # Every backend is wired now: OpenEnv both ways, NeMo Gym (to its wire protocol),
    # verifiers both ways, ART out and in, RULER.
    assert all(b["wired"] for b in doc["backends"])
    nemo = next(b for b in doc["backends"] if b["name"] == "nemo_gym")
    assert nemo["requires"] == [] and "templates.nemo_gym" in nemo["provides"]


def test_backends_list_text(capsys) -> None:
    assert main(["backends", "list"]) == 0
    out = capsys.readouterr().out
    assert "openenv" in out and "needs: openenv-core (installed)" in out


def test_missing_package_names_the_pip_install(monkeypatch) -> None:
    missing = backends.Requirement("openenv-core", "openenv_not_here_xyz")
    spec = backends.BACKENDS["openenv"]
    monkeypatch.setattr(
        backends,
        "BACKENDS",
        {
            **backends.BACKENDS,
            "openenv": backends.BackendSpec(spec.name, spec.description, (missing,), spec.provides),
        },
    )
    with pytest.raises(RolloutError, match=r"pip install openenv-core"):
        backends.require("openenv")
    with pytest.raises(RolloutError, match=r"pip install some-pkg"):
        backends.require_module("some-pkg", "some_pkg_not_here", "the thing")


def test_unwired_backend_says_so(monkeypatch) -> None:
    spec = backends.BACKENDS["nemo_gym"]
    unwired = backends.BackendSpec(spec.name, spec.description, (), "not here", wired=False)
    monkeypatch.setattr(backends, "BACKENDS", {**backends.BACKENDS, "nemo_gym": unwired})
    with pytest.raises(RolloutError, match="'nemo_gym' is not wired yet: not here"):
        backends.require("nemo_gym")
