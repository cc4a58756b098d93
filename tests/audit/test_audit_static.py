"""Plan-time warnings: what a verifier lets through, seen without running it, by config path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rollout.shared.audit.static import verifier_warnings
from rollout.shared.contracts.envspec import VerifierSpec
from rollout.shared.envs import load_environments

ROOT = Path(__file__).resolve().parents[2]


def _specs(path: Path) -> dict:
    return {e.slug: e.to_spec() for e in load_environments(path)}


def test_each_static_case_is_named_by_its_path() -> None:
    specs = _specs(Path(__file__).parent / "weak_envs.py")
    [echo] = verifier_warnings(specs["weak-echo"])
    assert echo.startswith("verifier.primitives[0] (mentions, contains_terms): its terms appear")
    assert "instruction of 4 of 4 task(s)" in echo
    [called] = verifier_warnings(specs["weak-called"])
    assert called.startswith("verifier.primitives[0] (refunded, tool_was_called): no `args`")
    [weights] = verifier_warnings(specs["weak-weights"])
    assert weights.startswith("verifier: 80% of the weight is on checks")


def test_hidden_tests_run_in_process_are_named_as_forgeable() -> None:
    [spec] = [e.to_spec() for e in load_environments(ROOT / "examples" / "code_editing_fix.py")]
    assert verifier_warnings(spec) == []
    exposed = spec.model_copy(update={"config": {**spec.config, "testIsolation": "in-process"}})
    [warning] = verifier_warnings(exposed)
    assert warning.startswith("config.testIsolation: in-process: tests_pass imports")


def test_the_examples_have_none_and_rollout_plan_reports_them() -> None:
    for path in sorted((ROOT / "examples").glob("*.py")):
        for slug, spec in _specs(path).items():
            assert verifier_warnings(spec) == [], slug
    done = subprocess.run(
        [sys.executable, "-m", "rollout.cli", "plan", str(Path(__file__).parent / "weak_envs.py"),
         "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # Warnings do not make the plan fail: the env is valid, only weak.
    assert done.returncode == 0, done.stderr
    envs = {e["slug"]: e for e in json.loads(done.stdout)["environments"]}
    assert len(envs["weak-called"]["warnings"]) == 1
    assert envs["weak-weights"]["warnings"][0].startswith("verifier: 80%")


def test_hidden_tests_that_run_values_as_code_are_named() -> None:
    [spec] = [e.to_spec() for e in load_environments(ROOT / "examples" / "code_editing_fix.py")]
    task = spec.tasks[0]
    truth = dict(task.hidden_ground_truth)
    truth["tests"] = {
        "test_repr.py": "import pickle\nfrom calc import Point\n\n\ndef test_round_trip():\n"
        "    p = Point(1, 2)\n    assert eval(repr(p)) == p\n"
        "    assert pickle.loads(pickle.dumps(p)) == p\n"
    }
    exposed = spec.model_copy(
        update={"tasks": [task.model_copy(update={"hidden_ground_truth": truth})]}
    )
    [warning] = verifier_warnings(exposed)
    assert warning.startswith("tasks[0].hiddenGroundTruth.tests['test_repr.py']: calls eval, ")
    assert "pickle.loads" in warning


def test_an_answer_check_that_finds_its_answer_anywhere_is_named() -> None:
    # "0 1 2 ... 1000" holds every count: found by `contains` or a pattern not anchored at both
    # ends (rollout audit's answer_every_candidate passes them), never by exact or numeric.
    [spec] = [e.to_spec() for e in load_environments(ROOT / "examples" / "ticket_routing.py")]

    def warned(**params: object) -> list[str]:
        prim = {"name": "answer", "type": "final_answer_match", **params}
        verifier = VerifierSpec(primitives=[prim])
        return verifier_warnings(spec.model_copy(update={"verifier": verifier}))

    [contains] = warned(mode="contains", expected="7")
    assert contains.startswith("verifier.primitives[0] (answer, final_answer_match): mode contains")
    assert "an answer that lists every candidate passes" in contains
    [loose] = warned(mode="regex", expected=r"\b7\b")
    assert r"mode regex with /\b7\b/ not anchored at both ends" in loose
    assert warned(mode="regex", expected=r"^\s*7\s*$") == warned(mode="regex", expected=r"\A7\Z")
    assert warned(mode="regex", expected=r"^\s*7\s*$") == []
    assert warned(mode="regex", expected=r"^7\$") != []
    assert warned(mode="exact", expected="7") == warned(mode="numeric", expected=7) == []
