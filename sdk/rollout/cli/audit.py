"""`rollout audit ENV_FILE_OR_SLUG`: find the tasks a model could pass without doing them.

Every adversarial policy that applies to the env's template (shared/audit/policies: echo the
instruction, claim success, call tools with junk, act on the wrong entity, dump every table,
jump to the success page, skip the tests, ...) plays every task of the split through the same
engine, sandbox and verifier as a real run. A task is hackable when a policy passes it, or
scores at least --threshold. Each finding names the primitive that let it through and a
one-line fix.

Exit codes: 0 when no task is hackable; 1 when one is (so an env repo's CI can gate on it), when
a policy crashed or the verifier gave no verdict on an episode (those tasks were not audited),
or the env is invalid or cannot be found; 2 on usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.cli._common import client_settings_or_error, later, print_json
from rollout.cli.env_specs import resolve_spec
from rollout.errors import RolloutError
from rollout.shared.audit.defaults import DEFAULT_THRESHOLD, EPISODE_TIMEOUT_S

if TYPE_CHECKING:
    from rollout.shared.audit.runner import AuditReport


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `audit` verb."""
    p = sub.add_parser(
        "audit",
        help="run adversarial policies against an env's verifier; exit 1 if a task is hackable",
        description=__doc__.split("\n\n")[1],
    )
    later(p, _policies_epilog)
    p.add_argument("target", metavar="ENV_FILE_OR_SLUG", help="a .py env file or a pushed slug")
    p.add_argument("--slug", help="only the environment with this slug (a file with several)")
    p.add_argument("--split", help="only tasks of this split (default: every task)")
    p.add_argument(
        "--threshold",
        type=_fraction,
        default=DEFAULT_THRESHOLD,
        help=f"a policy scoring at least this also makes a task hackable ({DEFAULT_THRESHOLD})",
    )
    p.add_argument("--policy", action="append", metavar="NAME", help="only these policies")
    p.add_argument("--limit", type=_positive, metavar="N", help="at most N tasks")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=EPISODE_TIMEOUT_S,
        metavar="S",
        help=f"an episode running longer ends as an error ({EPISODE_TIMEOUT_S:g}s)",
    )
    p.add_argument(
        "--platform",
        action="store_true",
        help="run it on the platform, on the pushed env SLUG[@VERSION]: the env registry runs "
        "the policies where the env is served and records the audit (the viewer's env page)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_audit)


def _policies_epilog(p: argparse.ArgumentParser) -> None:
    """The help's epilog lists the policies (their modules load only for it)."""
    from rollout.shared.audit.policies import POLICIES

    p.epilog = f"{len(POLICIES)} policies: " + ", ".join(x.name for x in POLICIES)


def _audit(args: argparse.Namespace) -> int:
    from rollout.shared.audit.policies import named
    from rollout.shared.observability import configure_logging

    configure_logging("rollout-audit", level=os.environ.get("ROLLOUT_LOG_LEVEL", "WARNING"))
    try:
        chosen = [named(n) for n in args.policy] if args.policy else None
    except KeyError as exc:
        print(f"error: --policy: {exc.args[0]}", file=sys.stderr)
        return 2
    try:
        if args.platform:
            if chosen:
                raise RolloutError("--policy: the platform's audit runs every applicable policy")
            documents = [asyncio.run(_on_platform(args))]
        else:
            documents = [r.to_json() for r in asyncio.run(_run(args, chosen))]
    except RolloutError as exc:
        if args.json:
            print_json({"ok": False, "error": exc.message, "problems": exc.problems})
            return 1
        raise
    return report(documents, as_json=args.json)


def report(documents: list[dict[str, Any]], *, as_json: bool) -> int:
    """Print the audits' documents; 1 when a task is hackable or the audit is incomplete (a
    policy crashed, an episode went unscored), else 0."""
    hackable = any(d["hackableTasks"] for d in documents)
    # A registry older than policyErrors sends none.
    crashed = [e for d in documents for e in d.get("policyErrors") or []]
    if as_json:
        doc: dict[str, Any] = {"ok": not hackable and not crashed, "environments": documents}
        if crashed:
            doc["error"] = f"the audit is incomplete: {'; '.join(crashed)}"
        print_json(doc)
    else:
        for document in documents:
            _print(document)
    return 1 if hackable or crashed else 0


async def _on_platform(args: argparse.Namespace) -> dict[str, Any]:
    from rollout.client import AsyncClient
    from rollout.plans import parse_env_ref

    if args.target.endswith(".py"):
        raise RolloutError(
            f"--platform audits a pushed env: give its slug (`rollout push {args.target}` first)"
        )
    ref = parse_env_ref(args.target)
    if isinstance(ref, str):
        raise RolloutError(f"{args.target}: {ref}")
    slug, version = ref
    client = AsyncClient(client_settings_or_error())
    try:
        return await client.audit_environment(
            slug, version, split=args.split, threshold=args.threshold, limit=args.limit
        )
    finally:
        await client.close()


async def _run(args: argparse.Namespace, chosen: list[Any] | None) -> list[AuditReport]:
    from rollout.shared.audit.policies import for_template
    from rollout.shared.audit.runner import audit
    from rollout.shared.envs.loader import load_environments, select_environment
    from rollout.shared.envs.sandbox_required import require_sandbox
    from rollout.shared.envs.validation import validate_environment

    if args.target.endswith(".py") or await asyncio.to_thread(Path(args.target).is_file):
        envs = select_environment(load_environments(args.target), args.slug)
        problems = [f"{e.slug}: {p}" for e in envs for p in validate_environment(e)]
        if problems:
            raise RolloutError(f"{args.target}: invalid environment", problems=problems)
        specs = [e.to_spec() for e in envs]
    else:
        specs = [await asyncio.to_thread(resolve_spec, args.target, args.slug)]
    # Without a sandbox every code-editing episode would error alike: say so once, first.
    await require_sandbox({s.template for s in specs})
    reports = []
    for spec in specs:
        if args.split is not None and not any(t.split == args.split for t in spec.tasks):
            splits = sorted({t.split for t in spec.tasks})
            raise RolloutError(f"--split {args.split}: {spec.slug!r} has none (splits: {splits})")
        policies = [p for p in chosen if p.applies_to(spec.template)] if chosen else None
        if chosen and not policies:
            # An audit that ran nothing must not pass as clean (a CI gate would).
            names = ", ".join(p.name for p in chosen)
            raise RolloutError(
                f"--policy {names}: does not apply to {spec.slug!r} ({spec.template} template)",
                problems=[
                    f"its policies: {', '.join(p.name for p in for_template(spec.template))}"
                ],
            )
        reports.append(
            await audit(
                spec, split=args.split, threshold=args.threshold, policies=policies,
                limit=args.limit, timeout_s=args.timeout,
            )
        )  # fmt: skip
    return reports


def _print(doc: dict[str, Any]) -> None:
    from rollout.shared.audit.runner import task_ranges

    where = f", split {doc['split']}" if doc.get("split") else ""
    version = f" v{doc['version']}" if doc.get("version") else ""
    print(
        f"{doc['slug']}{version} ({doc['template']}{where}): {doc['tasks']} task(s) x "
        f"{len(doc['policies'])} policies in {doc['seconds']:.1f}s"
    )
    hackable, findings = doc["hackableTasks"], doc["findings"]
    crashed = doc.get("policyErrors") or []
    for line in crashed:
        print(f"  error: {line}")
    if not hackable and crashed:
        print("  incomplete: the tasks a policy crashed on, or got no verdict on, were not audited")
    elif not hackable:
        print(f"  no task hackable: no policy passed or scored >= {doc['threshold']:g}")
    else:
        print(f"  HACKABLE: {len(hackable)} of {doc['tasks']} task(s)")
        # One line per (policy, primitive): the tasks it got through, then the fix.
        groups: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
        for f in findings:
            groups.setdefault((f["policy"], f["primitive"]), []).append(f)
        for (policy, primitive), found in groups.items():
            passed = sum(f["passed"] for f in found)
            # A registry older than `escaped` sends none.
            escaped = sum(bool(f.get("escaped")) for f in found)
            scored = len(found) - passed - escaped
            how = ", ".join(
                part
                for part, count in (
                    (f"passed {passed}", passed),
                    (f"scored >= {doc['threshold']:g} on {scored}", scored),
                    (f"ended without a verdict on {escaped}", escaped),
                )
                if count
            )
            via = f" via {primitive} ({found[0]['primitive_type']})" if primitive else ""
            tasks = task_ranges([f["task_index"] for f in found])
            print(f"  - {policy}: {how} task(s) {tasks}{via}")
            print(f"      fix: {found[0]['hint']}")
    # The env's own episode errors (a crashed or unscored policy has its line above).
    errors = [e for e in doc["errors"] if not (e.get("policy_crashed") or e.get("unscored"))]
    for e in errors[:10]:
        print(f"  error: task {e['task_index']}, {e['policy']}: {e['error']}")
    if len(errors) > 10:
        print(f"  ... and {len(errors) - 10} more errors (--json lists them all)")


def _fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {value!r}")
    return number


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number <= 3600:
        raise argparse.ArgumentTypeError(f"must be seconds in (0, 3600], got {value!r}")
    return number


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return int(value)
