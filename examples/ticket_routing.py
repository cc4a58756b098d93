"""Workflow template, generated tasks: route each support ticket to the team that owns it.

Held out means held out: the train and test splits are drawn from one family (a customer, a
one-sentence complaint holding a team's cue word) but from disjoint POOLS: other customers and
other sentences, so no test instruction, customer or ticket text (nor any 6-word span of one)
occurs in train. What carries over is the per-team cue vocabulary (`CUES`: 'invoice' and
'refund' mean billing in either split), which is what a model has to learn from the train
split to route a ticket it has never seen. This is the env `rollout demo` learns on by default.
"""

import random

from rollout import Environment, Task, action_tool, primitive, verifier_config, workflow_config

# The cue words of each team: every complaint holds one of its own team's and none of the
# others'; tests/envs/test_heldout.py checks that each test complaint's cue also occurs in a
# train complaint of the same team (learnable) and that nothing else is shared.
CUES = {
    "billing": ["invoice", "refund", "charged", "charge", "payment", "receipt", "bill", "fee"],
    "shipping": ["parcel", "package", "tracking", "courier", "delivery", "shipment"],
    "technical": ["app", "website", "error", "upload", "sync", "crashes", "update"],
    "account": ["password", "login", "username", "account", "profile", "email"],
}
COMPLAINTS = {
    "train": {
        "billing": [
            "I was charged twice for my last invoice",
            "please refund the extra fee on my bill",
            "my card payment went through two times",
            "the receipt shows a price I never agreed to",
            "I cancelled but the charge still appeared",
            "can I get a refund for the unused month",
        ],
        "shipping": [
            "my parcel never arrived at my door",
            "the package came damaged and wet",
            "the tracking number does not show anything",
            "the courier left my delivery at the wrong house",
            "my shipment has been stuck for ten days",
            "the delivery date keeps moving back every week",
        ],
        "technical": [
            "the app crashes every time I open it",
            "the website shows a blank error page",
            "I cannot upload photos from my phone",
            "the sync button does nothing at all",
            "the app freezes on the loading screen",
            "every upload stops at ninety percent",
        ],
        "account": [
            "I forgot my password and cannot get in",
            "please change the email on my profile",
            "I want to close my account for good",
            "my login code never comes through",
            "someone else changed my username last night",
            "the password reset link has expired again",
        ],
    },
    "test": {
        "billing": [
            "why does my bill list a charge I do not recognise",
            "the invoice total is higher than the quoted price",
            "I need a refund because the payment was taken by mistake",
            "a second payment left my bank yesterday",
            "there is a late fee on my statement that should not be there",
            "I was charged for a plan I never picked",
            "please send me a copy of the receipt for march",
            "my refund still has not reached my card",
        ],
        "shipping": [
            "the courier says it was dropped off but nothing is here",
            "my package was sent to my old street",
            "tracking has not moved since last monday",
            "half of the shipment is missing from the box",
            "the parcel was opened before it reached me",
            "can the delivery be moved to friday instead",
            "the shipment arrived with the wrong items inside",
            "a neighbour signed for my package and kept it",
        ],
        "technical": [
            "after the update the app will not start",
            "the website keeps logging an error in the console",
            "files never sync between my two laptops",
            "the app crashes as soon as I tap settings",
            "the website is very slow on my tablet",
            "video upload fails with a timeout",
            "the app shows old data after I add a note",
            "my calendar will not sync with the phone",
        ],
        "account": [
            "my account is locked after three wrong tries",
            "how do I change the email tied to my login",
            "I would like a new username please",
            "the password rules will not accept anything I type",
            "I need to reset the password for my work address",
            "please delete the photo on my profile",
            "my email changed and I cannot verify it",
            "two people share one login and we want separate ones",
        ],
    },
    # Where recipes are chosen (learning rate, steps, tasks per step); test is only reported.
    "validation": {
        "billing": [
            "the fee on this month's invoice looks wrong",
            "I paid but the receipt never came",
            "please explain the extra charge from tuesday",
            "I still wait for the refund you promised",
        ],
        "shipping": [
            "the courier has not shown up all week",
            "my parcel went to a different city",
            "the tracking page says lost in transit",
            "one box of the shipment is still out there",
        ],
        "technical": [
            "the app logs me out every few minutes",
            "the website buttons do not respond",
            "an error pops up when I save a file",
            "since the app update my screen stays black",
        ],
        "account": [
            "I cannot remember my username",
            "my profile picture will not change",
            "the login page rejects my new code",
            "please merge my two account records",
        ],
    },
}
CUSTOMERS = {
    "train": ["Alice", "Bob", "Chen", "Dana", "Eve", "Farid", "Gita", "Hugo", "Iris", "Jon"],
    "test": ["Kofi", "Lena", "Mateo", "Nadia", "Omar", "Priya"],
    "validation": ["Quinn", "Rosa", "Sven", "Tara"],
}
TEAMS = sorted(CUES)
# Each train complaint is filed twice (by two customers), each held-out one once: 48 / 32 / 16.
COPIES = {"train": 2, "test": 1, "validation": 1}

rng = random.Random(11)
# Teams interleaved: every team shows up early in the train split.
TICKETS = [
    {"team": team, "customer": rng.choice(CUSTOMERS[split]), "text": text, "split": split}
    # Validation last: the train and test tasks keep their indices and customers.
    for split in ("train", "test", "validation")
    for _ in range(COPIES[split])
    for j in range(len(COMPLAINTS[split][TEAMS[0]]))
    for team in TEAMS
    for text in [COMPLAINTS[split][team][j]]
]

env = Environment(
    slug="ticket-routing",
    name="Ticket routing",
    template="workflow",
    description="Route a support ticket to billing, shipping, technical or account.",
    # A right answer is one ~20-token call: a confused model is cut at 48 tokens a turn.
    budgets={"max_turn_tokens": 48},
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
            input={"customer": t["customer"], "ticket": t["text"]},
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
