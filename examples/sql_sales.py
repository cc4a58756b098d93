"""SQL template: answer questions about a small sales database with one query.

Questions come from a few kinds (customers per country, orders over an amount, orders per
month, a customer's total), asked about disjoint pools of values in each split and phrased
differently: train and test ask the same kinds of question, never about the same country,
threshold, month or customer, and never in the same words.
"""

import random

from rollout import Environment, Task

SCHEMA = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    amount REAL NOT NULL,
    placed_on TEXT NOT NULL
);
"""

COUNTRIES = {
    "DE": "Germany", "FR": "France", "US": "the United States", "IT": "Italy", "ES": "Spain",
    "BR": "Brazil", "JP": "Japan", "IN": "India",
}  # fmt: skip
CODES = list(COUNTRIES)
# Country k has k + 1 customers and month m has m + 2 orders: no two questions of a kind share
# an answer, so one guessed number cannot pass every "how many" question.
HOMES = [code for k, code in enumerate(CODES) for _ in range(k + 1)]
CUSTOMER_COUNT = len(HOMES)
PLACED = [(m, day) for m in range(1, 10) for day in range(m + 2)]
SEED = "\n".join(
    [
        f"INSERT INTO customers VALUES ({i}, 'c{i}', '{HOMES[(7 * i) % CUSTOMER_COUNT]}');"
        for i in range(1, CUSTOMER_COUNT + 1)
    ]
    + [
        f"INSERT INTO orders VALUES ({i}, {1 + i % CUSTOMER_COUNT}, {10.5 * (i % 7) + 3}, "
        f"'2024-0{m}-1{day % 10}');"
        for i, (m, day) in enumerate(PLACED, start=1)
    ]
)
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September"]

# The values each split asks about (disjoint), and each split's phrasing of each kind.
POOLS = {
    "train": {
        "country": ["DE", "FR", "US", "IT", "ES", "BR"],
        "threshold": [15, 25, 35, 45, 55],
        "month": [1, 2, 3, 4, 5, 6, 7],
        "customer": list(range(1, 9)),
    },
    "test": {
        "country": ["JP", "IN"],
        "threshold": [30, 60],
        "month": [8, 9],
        "customer": [17, 18],
    },
}
PHRASING = {
    "train": {
        "count": "How many customers are from {where}? Submit the query that answers it.",
        "names": "Which customers (names) are from {where}? Submit the query that answers it.",
        "over": "List the ids of orders over {x}. Submit the query that answers it.",
        "month": "How many orders were placed in {month}? Submit the query that answers it.",
        "total": "What is the total order amount of customer {who}? Submit the query that "
        "answers it.",
    },
    "test": {
        "count": "Count the customers based in {where}, answering with one SQL query.",
        "names": "Give the names of every customer located in {where} (one query).",
        "over": "Find which orders cost more than {x}; reply with a single query.",
        "month": "Write one query counting orders made during {month}.",
        "total": "Sum up all of {who}'s orders with one query.",
    },
}


def questions(split: str) -> list[tuple[str, str]]:
    """(question, reference query) of one split."""
    pool, say = POOLS[split], PHRASING[split]
    return (
        [
            (say["count"].format(where=COUNTRIES[c]),
             f"SELECT COUNT(*) FROM customers WHERE country = '{c}'")
            for c in pool["country"]
        ]
        + [
            (say["names"].format(where=COUNTRIES[c]),
             f"SELECT name FROM customers WHERE country = '{c}'")
            for c in pool["country"]
        ]
        + [
            (say["over"].format(x=x), f"SELECT id FROM orders WHERE amount > {x}")
            for x in pool["threshold"]
        ]
        + [
            (say["month"].format(month=MONTHS[m - 1]),
             f"SELECT COUNT(*) FROM orders WHERE placed_on LIKE '2024-0{m}-%'")
            for m in pool["month"]
        ]
        + [
            (say["total"].format(who=f"c{i}"),
             "SELECT SUM(o.amount) FROM orders o JOIN customers c ON o.customer_id = c.id "
             f"WHERE c.name = 'c{i}'")
            for i in pool["customer"]
        ]
    )  # fmt: skip


# Shuffled (seeded) so every kind of question shows up early in each split.
QUESTIONS = [(split, q, sql) for split in ("train", "test") for q, sql in questions(split)]
random.Random(3).shuffle(QUESTIONS)

env = Environment(
    slug="sales-sql",
    name="Sales SQL",
    template="sql",
    description="Answer with submit_answer(query=...).",
    schema=SCHEMA,
    seed=SEED,
    tasks=[
        Task(instruction=q, hidden_ground_truth={"query": sql}, split=split)
        for split, q, sql in QUESTIONS
    ],
)
