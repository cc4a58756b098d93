"""Plugin environment: the env is Python code behind a `module:function` entrypoint.

Train and test tasks ask for other targets in other words: a test target is never a train one.
"""

from rollout import Environment, Task, plugin_config, primitive, verifier_config

PHRASINGS = {
    "train": [
        "Increment the counter until it reaches {n}.",
        "Bring the counter to {n}.",
        "The counter should read {n}; increment it.",
        "Count up to {n}.",
    ],
    "test": [
        "Make the counter show {n}.",
        "Raise the counter to exactly {n}.",
        "Get the counter up to {n}.",
    ],
}
# No target below 3: `rollout audit` found that a policy calling every tool once or twice (or
# incrementing until the counter refuses) passed the small targets when only the value was
# checked; the verifier also fails an increment past the target.
TARGETS = {"train": [3, 5, 6, 8, 9], "test": [4, 7]}

env = Environment(
    slug="counter-plugin",
    name="Counter (plugin)",
    template="plugin",
    config=plugin_config("example_plugins.counter:make_env", {"step": 1}),
    # Counting up is the same call again and again: no repeated-call limit here.
    budgets={"max_repeated_calls": 0},
    verifier=verifier_config(
        # An episode that overshoots earns 2/3 of the reward, one that does nothing 1/3.
        primitive("reached", "state_match", weight=2),
        primitive("no_overshoot", "no_tool_errors", weight=1),
    ),
    tasks=[
        Task(
            instruction=phrasing.format(n=n),
            input={"target": n},
            hidden_ground_truth={"value": n},
            split=split,
        )
        for split in ("train", "test")
        for phrasing in PHRASINGS[split]
        for n in TARGETS[split]
    ],
)
