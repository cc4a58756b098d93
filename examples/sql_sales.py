"""SQL template: answer questions about a small sales database with one query."""

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

COUNTRIES = ["DE", "FR", "US", "JP"]
SEED = "\n".join(
    [f"INSERT INTO customers VALUES ({i}, 'c{i}', '{COUNTRIES[i % 4]}');" for i in range(1, 13)]
    + [
        f"INSERT INTO orders VALUES ({i}, {1 + i % 12}, {10.5 * (i % 7) + 3}, "
        f"'2024-0{1 + i % 9}-1{i % 10}');"
        for i in range(1, 41)
    ]
)

NAMES = {"DE": "Germany", "FR": "France", "US": "the United States", "JP": "Japan"}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September"]

# Questions from a few templates with generated parameters; shuffled (seeded) and split every
# fourth to test, so train and test ask the same kinds of question about other values.
QUESTIONS = (
    [
        (f"How many customers are from {NAMES[c]}?",
         f"SELECT COUNT(*) FROM customers WHERE country = '{c}'")
        for c in COUNTRIES
    ]
    + [
        (f"Which customers (names) are from {NAMES[c]}?",
         f"SELECT name FROM customers WHERE country = '{c}'")
        for c in COUNTRIES
    ]
    + [
        (f"List the ids of orders over {x}.", f"SELECT id FROM orders WHERE amount > {x}")
        for x in (20, 30, 40, 50, 60)
    ]
    + [
        (f"How many orders were placed in {MONTHS[m - 1]} 2024?",
         f"SELECT COUNT(*) FROM orders WHERE placed_on LIKE '2024-0{m}-%'")
        for m in range(1, 10)
    ]
    + [
        (f"What is the total order amount of customer c{i}?",
         "SELECT SUM(o.amount) FROM orders o JOIN customers c ON o.customer_id = c.id "
         f"WHERE c.name = 'c{i}'")
        for i in range(1, 13)
    ]
)  # fmt: skip
random.Random(3).shuffle(QUESTIONS)

env = Environment(
    slug="sales-sql",
    name="Sales SQL",
    template="sql",
    description="Answer with submit_answer(query=...).",
    schema=SCHEMA,
    seed=SEED,
    tasks=[
        Task(
            instruction=q + " Submit the query that answers it.",
            hidden_ground_truth={"query": sql},
            split="test" if i % 4 == 3 else "train",
        )
        for i, (q, sql) in enumerate(QUESTIONS)
    ],
)
