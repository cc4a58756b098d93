"""Workflow template, generated tasks: route each support ticket to the team that owns it.

Train and test tickets are drawn from one distribution (seeded: the same complaints, other
customers and combinations), so what a model learns on the train split can show on the test
split. This is the env `rollout demo` learns on by default.
"""

import random

from rollout import Environment, Task, action_tool, primitive, verifier_config, workflow_config

COMPLAINTS = {
    "billing": [
        "I was charged twice this month",
        "my invoice shows the wrong amount",
        "please refund the extra fee",
        "my card was billed after I cancelled",
    ],
    "shipping": [
        "my parcel never arrived",
        "the box came damaged",
        "the tracking number does not work",
        "my order went to the wrong address",
    ],
    "technical": [
        "the app crashes when I open it",
        "the website shows an error page",
        "I cannot upload my photos",
        "the sync button does nothing",
    ],
    "account": [
        "I forgot my password",
        "please change the email on my account",
        "I want to delete my account",
        "my login code never comes",
    ],
}
CUSTOMERS = ["Alice", "Bob", "Chen", "Dana", "Eve", "Farid", "Gita", "Hugo", "Iris", "Jon"]
TEAMS = sorted(COMPLAINTS)
COPIES = 4  # tickets per complaint: three train, one test

rng = random.Random(11)
# Ticket k of complaint j of every team, teams interleaved: every team shows up early in
# the train split, and each complaint has one held-out (test) ticket from another customer.
TICKETS = [
    {
        "team": team,
        "customer": rng.choice(CUSTOMERS),
        "text": COMPLAINTS[team][j],
        "split": "test" if k == (j % COPIES) else "train",
    }
    for k in range(COPIES)
    for j in range(4)
    for team in TEAMS
]

env = Environment(
    slug="ticket-routing",
    name="Ticket routing",
    template="workflow",
    description="Route a support ticket to billing, shipping, technical or account.",
    config=workflow_config(
        tools=[
            action_tool(
                "route_ticket",
                state_array="routed",
                description="Send the ticket to a team: billing, shipping, technical or account.",
                params_schema={"team": "string"},
            )
        ],
        initial_mutable_state={"routed": []},
    ),
    tasks=[
        Task(
            instruction=f'Route this ticket from {t["customer"]}: "{t["text"]}."',
            hidden_ground_truth={"routed": [{"team": t["team"]}]},
            split=t["split"],
        )
        for t in TICKETS
    ],
    verifier=verifier_config(
        primitive("called", "tool_was_called", tool="route_ticket", weight=1),
        primitive("routed", "state_match", weight=3),
        primitive("no_errors", "no_tool_errors", weight=1),
    ),
)
