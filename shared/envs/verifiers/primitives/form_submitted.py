"""`form_submitted`: a form was submitted (minCount times) with the expected values."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.compare import short, values_equal
from rollout.shared.envs.verifiers.primitives.common import binary
from rollout.shared.envs.verifiers.registry import (
    Outcome,
    ScoreContext,
    register,
)


class FormSubmittedParams(CamelModel):
    """`form_submitted`: a form was submitted, optionally with these field values."""

    form: str | None = None
    fields: dict[str, Any] | None = None
    min_count: int = Field(default=1, ge=1)
    # At most this many submissions of the form, matching or not: a model that submits once
    # with every option (one account per plan) has one matching submission among them.
    max_count: int | None = Field(default=None, ge=1)


@register(
    "form_submitted",
    FormSubmittedParams,
    templates=("browser",),
    truth_fields={"form": "form", "fields": "fields"},
)
def form_submitted(p: FormSubmittedParams, ctx: ScoreContext) -> Outcome:
    """A form was submitted (at least minCount times, at most maxCount) with the expected field
    values."""
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    form = p.form or gt.get("form")
    fields = p.fields if p.fields is not None else gt.get("fields")
    subs = [s for s in ctx.state.get("submissions") or [] if isinstance(s, dict)]
    matching = []
    for s in subs:
        if form and s.get("form") != form:
            continue
        values = s.get("values") or {}
        if fields and not all(
            k in values and (values_equal(v, values[k]) or str(v).strip() == str(values[k]).strip())
            for k, v in fields.items()
        ):
            continue
        matching.append(s)
    what = (form or "any form") + (f" with {short(fields)}" if fields else "")
    of_form = [s for s in subs if not form or s.get("form") == form]
    if p.max_count is not None and len(of_form) > p.max_count:
        return binary(
            False,
            f"{form or 'forms'} submitted {len(of_form)} times, more than {p.max_count}"
            f" ({len(matching)} matching {what})",
        )
    ok = len(matching) >= p.min_count
    return binary(ok, f"{what}: {len(matching)} matching submission(s) of {len(subs)}")
