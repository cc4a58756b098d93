"""Custom template: a ticket desk whose tools template responses and mutate state."""

from rollout import Environment, Task, custom_config, custom_tool

TICKETS = {f"T-{i}": {"title": f"Printer {i} jammed", "status": "open"} for i in range(1, 9)}

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
            instruction=f"Close ticket T-{i}; the printer was fixed.",
            hidden_ground_truth={f"tickets.T-{i}.status": "closed", "closed.length": 1},
            split="train" if i <= 6 else "test",
        )
        for i in range(1, 9)
    ],
)
