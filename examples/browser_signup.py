"""Browser template: find the signup form on a mock site and submit it."""

from rollout import Environment, Task, browser_config, browser_page, primitive, verifier_config

PAGES = [
    browser_page(
        "https://shop.test/",
        title="Shop",
        text="Welcome to the shop.",
        elements=[
            {"id": "nav-about", "type": "link", "text": "About", "href": "https://shop.test/about"},
            {
                "id": "nav-signup",
                "type": "link",
                "text": "Sign up",
                "href": "https://shop.test/signup",
            },
        ],
    ),
    browser_page("https://shop.test/about", title="About", text="We sell things."),
    browser_page(
        "https://shop.test/signup",
        title="Sign up",
        elements=[
            {"id": "signup", "type": "form", "action": "https://shop.test/welcome"},
            {"id": "email", "type": "input", "name": "email", "form": "signup", "required": True},
            {"id": "plan", "type": "input", "name": "plan", "form": "signup", "value": "free"},
            {"id": "go", "type": "button", "text": "Create account", "form": "signup"},
        ],
    ),
    browser_page("https://shop.test/welcome", title="Welcome", text="Account created."),
]

NAMES = ["ana", "ben", "cai", "dev", "eli", "fay", "gus", "hal", "ivy", "jo", "kim"]
PLANS = ["free", "pro", "team"]
# 33 generated signups (every name on every plan); every fourth is a test task.
PEOPLE = [(who, PLANS[(i + j) % 3]) for i, who in enumerate(NAMES) for j in range(3)]

env = Environment(
    slug="shop-signup",
    name="Shop signup",
    template="browser",
    config=browser_config(PAGES, initial_url="https://shop.test/"),
    tasks=[
        Task(
            instruction=f"Sign up {who}@example.com on the {plan} plan.",
            hidden_ground_truth={
                "form": "signup",
                "fields": {"email": f"{who}@example.com", "plan": plan},
            },
            split="test" if i % 4 == 3 else "train",
        )
        for i, (who, plan) in enumerate(PEOPLE)
    ],
    verifier=verifier_config(
        primitive("submitted", "form_submitted", weight=2),
        primitive("welcomed", "url_reached", url="https://shop.test/welcome", mode="final"),
    ),
)
