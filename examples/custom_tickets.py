"""Custom template: a ticket desk whose tools template responses and mutate state.

Train and test tickets come from one family (close the named ticket with a resolution note)
but from disjoint pools: other ticket numbers, other problems and other phrasings.
"""

from rollout import Environment, Task, custom_config, custom_tool

# (title, resolution) per split: a test ticket's problem never occurs in train.
PROBLEMS = {
    "train": [
        ("Printer {i} jammed", "the printer was fixed"),
        ("VPN down on laptop {i}", "the VPN profile was reinstalled"),
        ("Badge {i} does not open the door", "the badge was re-enabled"),
        ("Monitor {i} flickers", "the cable was replaced"),
    ],
    "test": [
        ("Projector {i} shows no picture", "its lamp got swapped"),
        ("Headset {i} has no sound", "a new driver went in"),
    ],
}
# The note is part of the task: a ticket closed with any other note is not done
# (`rollout audit` found that a guessed note passed when only the status was checked).
PHRASING = {
    "train": 'Close ticket {id} ({title}) with the note "{resolution}".',
    "test": 'For {id} ({title}): mark that ticket closed, noting "{resolution}".',
}
# T-101..T-124 are train tickets, T-901..T-908 test tickets.
NUMBERS = {"train": range(101, 125), "test": range(901, 909)}
TICKETS = [
    {
        "id": f"T-{i}",
        "title": PROBLEMS[split][k % len(PROBLEMS[split])][0].format(i=i),
        "resolution": PROBLEMS[split][k % len(PROBLEMS[split])][1],
        "split": split,
    }
    for split in ("train", "test")
    for k, i in enumerate(NUMBERS[split])
]

env = Environment(
    slug="ticket-desk",
    name="Ticket desk",
    template="custom",
    description="Close the right ticket with a resolution note.",
    config=custom_config(
        tools=[
            custom_tool(
                "list_tickets",
                description="List every ticket with its status.",
                response="${state.tickets}",
            ),
            custom_tool(
                "close_ticket",
                description="Close a ticket with a resolution note.",
                params_schema={"ticket_id": "string", "note": "string"},
                mutates=[
                    {"path": "tickets.${args.ticket_id}.status", "value": "closed"},
                    {
                        "path": "closed[]",
                        "value": {"id": "${args.ticket_id}", "note": "${args.note}"},
                    },
                ],
                response={"closed": "${args.ticket_id}"},
            ),
        ],
        initial_state={
            "tickets": {t["id"]: {"title": t["title"], "status": "open"} for t in TICKETS},
            "closed": [],
        },
    ),
    tasks=[
        Task(
            instruction=PHRASING[t["split"]].format(**t),
            hidden_ground_truth={
                f"tickets.{t['id']}.status": "closed",
                "closed.length": 1,
                "closed.0.note": t["resolution"],
            },
            split=t["split"],
            id=t["id"],
        )
        for t in TICKETS
    ],
)
