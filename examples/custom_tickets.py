"""Custom template: a ticket desk whose tools template responses and mutate state."""

from rollout import Environment, Task, custom_config, custom_tool

COUNT = 32
PROBLEMS = [
    ("Printer {i} jammed", "the printer was fixed"),
    ("VPN down on laptop {i}", "the VPN profile was reinstalled"),
    ("Badge {i} does not open the door", "the badge was re-enabled"),
    ("Monitor {i} flickers", "the cable was replaced"),
]
# T-1..T-32, problems in turn; every fourth ticket is a test task (one distribution).
TICKETS = {
    f"T-{i}": {"title": PROBLEMS[(i - 1) % 4][0].format(i=i), "status": "open"}
    for i in range(1, COUNT + 1)
}

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
        initial_state={"tickets": TICKETS, "closed": []},
    ),
    tasks=[
        Task(
            instruction=f"Close ticket T-{i} ({TICKETS[f'T-{i}']['title']}); "
            f"{PROBLEMS[(i - 1) % 4][1]}.",
            hidden_ground_truth={f"tickets.T-{i}.status": "closed", "closed.length": 1},
            split="test" if i % 4 == 0 else "train",
        )
        for i in range(1, COUNT + 1)
    ],
)
