"""Code-editing template: fix one function; hidden tests run in the bubblewrap sandbox.

Each task brings its own small module (`input.files`) with one buggy function, a visible test
and a hidden one. Train and test tasks come from one family but from disjoint pools of
function names, module names and arguments, so no test task's code, test or instruction is seen
in training.
"""

import random

from rollout import Environment, Task, code_editing_config, primitive, verifier_config

# (function, parameters, correct expression, buggy expression)
FUNCTIONS = {
    "train": [
        ("add", "a, b", "a + b", "a - b"),
        ("scale", "x, k", "x * k", "x + k"),
        ("double", "n", "n * 2", "n + 2"),
        ("difference", "a, b", "a - b", "b - a"),
        ("square", "n", "n * n", "n + n"),
        ("increment", "n", "n + 1", "n - 1"),
    ],
    "test": [
        ("triple", "n", "n * 3", "n + 3"),
        ("product", "a, b", "a * b", "a + b"),
        ("cube", "n", "n * n * n", "n * 3"),
    ],
}
MODULES = {"train": ["calc", "mathops", "numeric"], "test": ["arith", "compute"]}
# Arguments too: train tasks test on small numbers, test tasks on larger ones.
ARGUMENTS = {"train": range(3, 30), "test": range(31, 60)}
PHRASING = {
    "train": "`{fn}` in {module}.py returns the wrong result; fix it so the tests pass.",
    "test": "The tests of {module}.py fail: repair the bug in `{fn}`.",
}

rng = random.Random(9)


def _source(fn: str, params: str, expr: str) -> str:
    return f"def {fn}({params}):\n    return {expr}\n"


def _test(split: str, module: str, fn: str, params: str, expr: str, name: str) -> str:
    names = [p.strip() for p in params.split(",")]
    values = [rng.choice(ARGUMENTS[split]) for _ in names]
    expected = eval(expr, {}, dict(zip(names, values, strict=True)))  # noqa: S307 - our own table
    call = f"{fn}({', '.join(map(str, values))})"
    # The exact type first: a result whose __eq__ always says True (an int subclass, even on
    # the right of ==) would otherwise pass without the bug being fixed.
    return (
        f"from {module} import {fn}\n\n\ndef {name}():\n    result = {call}\n"
        f"    assert type(result) is int and result == {expected}\n"
    )


tasks = []
for split in ("train", "test"):
    for module in MODULES[split]:
        for fn, params, good, bad in FUNCTIONS[split]:
            tasks.append(
                Task(
                    instruction=PHRASING[split].format(fn=fn, module=module),
                    input={
                        "files": {
                            f"{module}.py": _source(fn, params, bad),
                            f"test_{module}.py": _test(
                                split, module, fn, params, good, "test_visible"
                            ),
                        }
                    },
                    hidden_ground_truth={
                        "tests": {
                            f"test_{module}_hidden.py": _test(
                                split, module, fn, params, good, "test_hidden"
                            )
                        },
                        # For the scripted demonstrations; the verifier only runs the tests.
                        "solution": {f"{module}.py": _source(fn, params, good)},
                    },
                    split=split,
                )
            )

env = Environment(
    slug="fix-calc",
    name="Fix calc",
    template="code-editing",
    config=code_editing_config(
        {},
        test_command=["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        test_timeout_seconds=60,
    ),
    tasks=tasks,
    verifier=verifier_config(primitive("tests", "tests_pass")),
)
