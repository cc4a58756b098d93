"""Code-editing template: fix a function; hidden tests run in the bubblewrap sandbox."""

import random

from rollout import Environment, Task, code_editing_config

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef scale(x, k):\n    return x + k\n"
VISIBLE_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"

CASES = [
    ("add", "from calc import add\n\n\ndef test_hidden():\n    assert add({a}, {b}) == {r}\n", "+"),
    (
        "scale",
        "from calc import scale\n\n\ndef test_hidden():\n    assert scale({a}, {b}) == {r}\n",
        "*",
    ),
]

# 24 tasks: either function, checked on generated arguments; every fourth is a test task.
rng = random.Random(9)
tasks = []
for i in range(24):
    name, template, op = CASES[i % 2]
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    result = a + b if op == "+" else a * b
    tasks.append(
        Task(
            instruction=f"`{name}` in calc.py is wrong; fix it so the tests pass.",
            hidden_ground_truth={"tests": {"test_hidden.py": template.format(a=a, b=b, r=result)}},
            split="test" if i % 4 == 3 else "train",
        )
    )

env = Environment(
    slug="fix-calc",
    name="Fix calc",
    template="code-editing",
    config=code_editing_config(
        {"calc.py": BUGGY, "test_calc.py": VISIBLE_TEST},
        test_command=["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        test_timeout_seconds=60,
    ),
    tasks=tasks,
)
