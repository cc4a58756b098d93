"""Whether numbers read from the read models may be stale, as the answers say it.

The tracker answers `get_run`/`list_runs` from Postgres read models a projector keeps up from
the events stream; when that projector is stalled (a full disk, a revoked privilege) the answers
go on looking current. Each answer carries its projection's lag (`readModels`, from
rollout.shared.stack.lag_probe), and the CLI and the viewer say so when it is behind and not
advancing. No NATS here: the SDK imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.shared.stack.projections import Lag

# A projector applying a running run's events is a few events behind at any moment, and
# advancing: only one that has applied nothing for this long reads as stale.
STALE_AFTER_S = 5.0


def lag_report(lag: Lag | None) -> dict[str, Any] | None:
    """The lag as an answer carries it (camelCase), with `stale`: behind and not advancing
    for over STALE_AFTER_S seconds."""
    if lag is None:
        return None
    return {
        "behind": lag.behind,
        "appliedSeq": lag.applied,
        "stalledS": round(lag.stalled_s, 1),
        "lastAppliedS": None if lag.last_applied_s is None else round(lag.last_applied_s, 1),
        "stale": lag.behind > 0 and lag.stalled_s > STALE_AFTER_S,
    }


def worst(*reports: dict[str, Any] | None) -> dict[str, Any] | None:
    """Of several answers' `readModels`, the stalest (stale first, then the most behind)."""
    known = [r for r in reports if r]
    if not known:
        return None
    return max(known, key=lambda r: (bool(r.get("stale")), r.get("behind", 0)))


def stale_note(report: dict[str, Any] | None) -> str | None:
    """One line saying the numbers may be stale, or None when they are not (or unknown)."""
    if not report or not report.get("stale"):
        return None
    last = report.get("lastAppliedS")
    when = "nothing applied yet" if last is None else f"last applied {_ago(float(last))}"
    return (
        f"the read models are {report['behind']} event(s) behind the event log ({when});"
        " these numbers may be stale — see `rollout status`"
    )


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"
