"""The `browser` template: a mock DOM from `pages[]`; navigate, read, click, type, submit.

State: `url` (current page), `history` (every page visited, in order), `forms` (typed values
per form id) and `submissions` (each submit's form, url and values).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.envs.checks import duplicates
from rollout.shared.envs.templates.base import BaseRuntime, ToolError
from rollout.shared.envs.templates.protocol import Plan, Template

# The config of its specs: a contract (schemas/templates/<name>.json is generated from it).


class BrowserElement(CamelModel):
    """One element of a mock page."""

    id: str = Field(min_length=1)
    type: Literal["text", "link", "input", "button", "form"]
    text: str = ""
    label: str = ""
    href: str | None = None
    name: str | None = None
    form: str | None = None
    value: str | None = None
    placeholder: str | None = None
    required: bool = False
    action: str | None = None


class BrowserPage(CamelModel):
    """One page of the mock site."""

    url: str = Field(min_length=1)
    title: str = ""
    text: str = ""
    elements: list[BrowserElement] = Field(default_factory=list)


class BrowserConfig(CamelModel):
    """Config of the `browser` template: a mock DOM and where the agent starts."""

    pages: list[BrowserPage] = Field(min_length=1)
    initial_url: str | None = None


NO_FORM = "_page"  # inputs outside any form keep their values under this key


def _element_view(el: BrowserElement, forms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    view: dict[str, Any] = {"id": el.id, "type": el.type}
    for key in ("text", "label", "href", "placeholder", "form", "name"):
        val = getattr(el, key)
        if val:
            view[key] = val
    if el.type == "input":
        typed = forms.get(el.form or NO_FORM, {}).get(el.name or el.id)
        view["value"] = typed if typed is not None else (el.value or "")
        if el.required:
            view["required"] = True
    return view


def _one_id(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise ToolError(f"argument {key!r} must be a non-empty string")
    return value


class BrowserRuntime(BaseRuntime):
    """One episode of a browser environment."""

    template = "browser"

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: BrowserConfig) -> None:
        super().__init__(spec, task)
        self.pages: dict[str, BrowserPage] = {p.url: p for p in config.pages}
        start = config.initial_url or config.pages[0].url
        self.url = start
        self.history: list[str] = [start]
        self.forms: dict[str, dict[str, Any]] = {}
        self.submissions: list[dict[str, Any]] = []
        obj = "object"
        self.add_tool(
            "navigate",
            "Open a page by URL.",
            {"type": obj, "properties": {"url": {"type": "string"}}, "required": ["url"]},
            self._navigate,
        )
        self.add_tool(
            "read_page",
            "Read the current page: URL, title, text and elements (with ids).",
            {"type": obj, "properties": {}},
            lambda args: self._read(),
        )
        self.add_tool(
            "click",
            "Click a link or button on the current page by element id.",
            {
                "type": obj,
                "properties": {"element_id": {"type": "string"}},
                "required": ["element_id"],
            },
            self._click,
        )
        self.add_tool(
            "type",
            "Type text into an input on the current page (replaces its value).",
            {
                "type": obj,
                "properties": {"element_id": {"type": "string"}, "text": {"type": "string"}},
                "required": ["element_id", "text"],
            },
            self._type,
        )
        self.add_tool(
            "submit",
            "Submit a form on the current page by its id.",
            {"type": obj, "properties": {"form_id": {"type": "string"}}, "required": ["form_id"]},
            lambda args: self._submit(_one_id(args, "form_id")),
        )

    @property
    def page(self) -> BrowserPage:
        """The page the browser is on."""
        return self.pages[self.url]

    def _element(self, element_id: str) -> BrowserElement:
        for el in self.page.elements:
            if el.id == element_id:
                return el
        ids = ", ".join(e.id for e in self.page.elements) or "none"
        raise ToolError(f"no element {element_id!r} on {self.url} (ids: {ids})")

    def _go(self, url: str) -> dict[str, Any]:
        if url not in self.pages:
            alt = url.rstrip("/") if url.endswith("/") else url + "/"
            if alt not in self.pages:
                raise ToolError(f"no page at {url!r}")
            url = alt
        self.url = url
        self.history.append(url)
        return self._read()

    def _navigate(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._go(_one_id(args, "url"))

    def _read(self) -> dict[str, Any]:
        page = self.page
        return {
            "url": page.url,
            "title": page.title,
            "text": page.text,
            "elements": [_element_view(e, self.forms) for e in page.elements],
        }

    def _click(self, args: dict[str, Any]) -> dict[str, Any]:
        el = self._element(_one_id(args, "element_id"))
        if el.type == "link":
            if not el.href:
                raise ToolError(f"link {el.id!r} has no href")
            return self._go(el.href)
        if el.type == "button":
            if el.form:
                return self._submit(el.form)
            if el.href:
                return self._go(el.href)
            return {"clicked": el.id, "url": self.url}
        raise ToolError(f"element {el.id!r} is a {el.type}; only links and buttons can be clicked")

    def _type(self, args: dict[str, Any]) -> dict[str, Any]:
        el = self._element(_one_id(args, "element_id"))
        if el.type != "input":
            raise ToolError(f"element {el.id!r} is a {el.type}; you can only type into inputs")
        text = args.get("text")
        if not isinstance(text, str):
            text = "" if text is None else str(text)
        self.forms.setdefault(el.form or NO_FORM, {})[el.name or el.id] = text
        return {"element": el.id, "value": text}

    def _submit(self, form_id: str) -> dict[str, Any]:
        form = next((e for e in self.page.elements if e.type == "form" and e.id == form_id), None)
        if form is None:
            forms = ", ".join(e.id for e in self.page.elements if e.type == "form") or "none"
            raise ToolError(f"no form {form_id!r} on {self.url} (forms: {forms})")
        values: dict[str, Any] = {}
        missing = []
        typed = self.forms.get(form_id, {})
        for el in self.page.elements:
            if el.type != "input" or el.form != form_id:
                continue
            key = el.name or el.id
            value = typed.get(key, el.value or "")
            values[key] = value
            if el.required and not value:
                missing.append(key)
        if missing:
            raise ToolError(f"form {form_id!r}: required field(s) empty: {', '.join(missing)}")
        self.submissions.append({"form": form_id, "url": self.url, "values": values})
        result: dict[str, Any] = {"submitted": form_id, "values": values}
        if form.action:
            result["page"] = self._go(form.action)
        return result

    def final_state(self) -> dict[str, Any]:
        """URL, history, typed form values and submissions."""
        return copy.deepcopy(
            {
                "url": self.url,
                "history": self.history,
                "forms": self.forms,
                "submissions": self.submissions,
            }
        )


BROWSER_STATE = ("url", "history", "forms", "submissions")


class BrowserTemplate(Template):
    """The `browser` template."""

    name = "browser"
    config_model = BrowserConfig
    runtime = BrowserRuntime
    fixed_tools = ("navigate", "read_page", "click", "type", "submit")

    def check_config(self, config: BrowserConfig, out: list[str]) -> None:
        """Duplicate pages and ids; links, forms and actions that name nothing."""
        urls = [p.url for p in config.pages]
        duplicates(urls, lambda i: f"config.pages[{i}].url", "page", out)
        known = set(urls)
        if config.initial_url is not None and config.initial_url not in known:
            out.append(f"config.initialUrl: no page {config.initial_url!r}")
        for i, page in enumerate(config.pages):
            ids = [e.id for e in page.elements]
            duplicates(ids, lambda j, i=i: f"config.pages[{i}].elements[{j}].id", "element id", out)
            forms = {e.id for e in page.elements if e.type == "form"}
            for j, el in enumerate(page.elements):
                where = f"config.pages[{i}].elements[{j}]"
                if el.href is not None and el.href not in known:
                    out.append(f"{where}.href: no page {el.href!r}")
                if el.type == "link" and not el.href:
                    out.append(f"{where}.href: a link needs an href")
                if el.form is not None and el.form not in forms:
                    out.append(f"{where}.form: no form {el.form!r} on {page.url}")
                if el.action is not None and el.action not in known:
                    out.append(f"{where}.action: no page {el.action!r}")

    def state_roots(self, config: BrowserConfig | None) -> set[str]:
        """The browser's state keys."""
        return set(BROWSER_STATE)

    def plan(self, spec: EnvironmentSpec, task: TaskSpec, runtime: Any) -> Plan | None:
        """Ground truth {"form": id, "fields": {name: value}}: open its page, fill, submit."""
        truth = task.hidden_ground_truth
        if not isinstance(truth, dict) or "form" not in truth:
            return None
        form = truth["form"]
        for page in spec.config.get("pages", []):
            elements = page.get("elements", [])
            if not any(e.get("id") == form for e in elements):
                continue
            plan: Plan = [("navigate", {"url": page["url"]})]
            for name, value in (truth.get("fields") or {}).items():
                element = next(
                    (e for e in elements if e.get("name") == name and e.get("form") == form), None
                )
                if element is None:
                    return None
                plan.append(("type", {"element_id": element["id"], "text": str(value)}))
            plan.append(("submit", {"form_id": form}))
            return plan
        return None


TEMPLATE = BrowserTemplate()
