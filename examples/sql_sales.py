"""SQL template: answer questions about a small sales database with one query."""

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

QUESTIONS = [
    (
        "How many customers are there per country?",
        "SELECT country, COUNT(*) FROM customers GROUP BY country",
    ),
    ("List the ids of orders over 50.", "SELECT id FROM orders WHERE amount > 50"),
    (
        "What is the total order amount per customer name?",
        "SELECT c.name, SUM(o.amount) FROM customers c JOIN orders o ON o.customer_id = c.id "
        "GROUP BY c.name",
    ),
    ("Which customers (names) are from Japan?", "SELECT name FROM customers WHERE country = 'JP'"),
    (
        "How many orders were placed in March 2024?",
        "SELECT COUNT(*) FROM orders WHERE placed_on LIKE '2024-03-%'",
    ),
    ("What is the largest single order amount?", "SELECT MAX(amount) FROM orders"),
]

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
            split="train" if i < 4 else "test",
        )
        for i, (q, sql) in enumerate(QUESTIONS)
    ],
)
