"""Browser template: find the signup form on a mock site and submit it.

Train and test signups come from one family (an email on a plan) but from disjoint pools of
people and phrasings; the plans are the form's options and so are shared.
"""

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

NAMES = {
    "train": ["ana", "ben", "cai", "dev", "eli", "fay", "gus", "hal"],
    "test": ["ivy", "jo", "kim"],
}
PLANS = ["free", "pro", "team"]
PHRASING = {
    "train": "Sign up {email} on the {plan} plan.",
    "test": "Create a {plan} account for {email}.",
}
# Every person on every plan: 24 train signups, 9 test ones.
PEOPLE = [
    (split, f"{who}@example.com", plan)
    for split in ("train", "test")
    for who in NAMES[split]
    for plan in PLANS
]

env = Environment(
    slug="shop-signup",
    name="Shop signup",
    template="browser",
    config=browser_config(PAGES, initial_url="https://shop.test/"),
    tasks=[
        Task(
            instruction=PHRASING[split].format(email=email, plan=plan),
            hidden_ground_truth={"form": "signup", "fields": {"email": email, "plan": plan}},
            split=split,
        )
        for split, email, plan in PEOPLE
    ],
    verifier=verifier_config(
        # Once: one account per plan would hold the right one among them.
        primitive("submitted", "form_submitted", weight=2, max_count=1),
        primitive("welcomed", "url_reached", url="https://shop.test/welcome", mode="final"),
    ),
)
