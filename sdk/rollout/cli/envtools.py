"""`rollout plan FILE`: validate environments without running anything."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from rollout.cli.experiments import plan_command
from rollout.errors import RolloutError


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `plan` verb."""
    plan = sub.add_parser(
        "plan",
        help="validate an environment file or an experiment plan (.toml) without running it",
        description="Load FILE, validate every Environment in it (or the whole experiment "
        "plan of a .toml), list every problem by path.",
    )
    plan.add_argument(
        "file", metavar="FILE", help="a .py file defining Environment(s), or a plan .toml"
    )
    plan.add_argument(
        "--with",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=MODEL",
        help="(plans) use MODEL for the plan's model NAME",
    )
    plan.add_argument("--slug", help="only this environment")
    plan.add_argument("--json", action="store_true", help="print one JSON document")
    plan.set_defaults(func=_plan)


def slug_of(env: Any) -> str | None:
    """An env's slug when it is a string: any other (a dict, a list) is a problem validation
    names, and cannot be counted (unhashable: `rollout plan` raised TypeError on it)."""
    slug = getattr(env, "slug", None)
    return slug if isinstance(slug, str) else None


def _summary(env: Any) -> dict[str, Any]:
    """Counts and names a person checks at a glance (only for a valid spec)."""
    from rollout.shared.audit.static import verifier_warnings
    from rollout.shared.envs.starts import tools_of
    from rollout.shared.envs.verifiers import default_verifier

    spec = env.to_spec()
    splits = Counter(t.split for t in spec.tasks)
    verifier = spec.verifier if spec.verifier and spec.verifier.primitives else None
    if verifier is None and spec.tasks:
        verifier = default_verifier(spec, spec.tasks[0])
        source = "default"
    else:
        source = "custom"
    tools, failure = tools_of(spec)
    return {
        "slug": spec.slug,
        "template": spec.template,
        "tasks": len(spec.tasks),
        "splits": dict(splits),
        "tools": tools,
        "verifier": {
            "source": source,
            "primitives": [f"{p.name} ({p.type}, w={p.weight:g})" for p in verifier.primitives]
            if verifier
            else [],
        },
        "specHash": spec.spec_hash(),
        # What the verifier lets through, seen statically (`rollout audit` runs the policies).
        "warnings": verifier_warnings(spec),
        "startFailure": failure,
    }


def _start_verdict(report: dict[str, Any], spec: Any) -> None:
    """An episode that cannot start: the env's own code (a plugin) fails its rollouts, so that
    is a problem; a remote env may simply not be up where plan runs, a warning."""
    from rollout.shared.envs.starts import check_starts

    failure = report.pop("startFailure")
    if report["template"] == "plugin":
        # Tasks the time ran out before are said as unchecked, not passed over in silence.
        check = check_starts(spec)
        report["problems"].extend(check.problems)
        report["warnings"].extend(check.warnings)
    elif failure is not None:
        report["warnings"].append(f"tasks[0]: could not start an episode to list tools: {failure}")


def _refuse(args: argparse.Namespace, message: str) -> int:
    """A flag that means nothing for this FILE: said (as JSON with --json), never ignored."""
    if not args.json:
        raise RolloutError(message)
    json.dump({"ok": False, "error": message, "problems": []}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 1


def _plan(args: argparse.Namespace) -> int:
    from rollout.environment import split_check
    from rollout.shared.envs.loader import load_environments, select_environment
    from rollout.shared.envs.splits import ids_matter
    from rollout.shared.envs.validation import validate_environment

    if args.file.endswith(".toml"):
        if args.slug is not None:
            # A plan names its environments itself: a --slug here would be silently ignored.
            return _refuse(
                args,
                "--slug: only for an environment file (.py); a plan picks one environment of a "
                "file with `slug` under [envs.NAME]",
            )
        return plan_command(args)
    if args.overrides:
        return _refuse(
            args, "--with: only for an experiment plan (.toml); an environment file names no models"
        )

    try:
        envs = select_environment(load_environments(args.file), args.slug)
    except RolloutError as exc:
        if args.json:
            doc = {"ok": False, "error": exc.message, "problems": exc.problems}
            json.dump(doc, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return 1
        raise
    reports = []
    audited: dict[int, bool] = {}  # report -> whether it has verifier warnings (audit hint)
    slugs = Counter(slug_of(e) for e in envs)
    for env in envs:
        problems = validate_environment(env)  # the split problems included
        tasks = getattr(env, "tasks", None)
        by_id = ids_matter(getattr(env, "template", None))
        split_warnings = split_check(tasks if isinstance(tasks, list) else [], ids_matter=by_id)[1]
        if (slug := slug_of(env)) is not None and slugs[slug] > 1:
            problems.append(f"slug: {slug!r} is used by {slugs[slug]} environments")
        report: dict[str, Any] = {"slug": getattr(env, "slug", None), "problems": problems}
        if not problems:
            report.update(_summary(env))
            audited[len(reports)] = bool(report["warnings"])
            report["warnings"] = split_warnings + report["warnings"]
            _start_verdict(report, env.to_spec())
        reports.append(report)
    ok = all(not r["problems"] for r in reports)
    if args.json:
        json.dump({"ok": ok, "file": args.file, "environments": reports}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if ok else 1
    for index, r in enumerate(reports):
        if r["problems"]:
            print(f"✗ {r['slug']}: {len(r['problems'])} problem(s)")
            for p in r["problems"]:
                print(f"    - {p}")
            continue
        splits = ", ".join(f"{k} {v}" for k, v in sorted(r["splits"].items()))
        print(f"✓ {r['slug']} ({r['template']}): {r['tasks']} task(s) [{splits}]")
        print(f"    tools: {', '.join(r['tools']) or 'none'}")
        print(f"    verifier ({r['verifier']['source']}): {'; '.join(r['verifier']['primitives'])}")
        print(f"    spec sha256: {r['specHash'][:16]}")
        for w in r["warnings"]:
            print(f"    ! {w}")
        if audited.get(index):
            print(f"    (`rollout audit {args.file}` runs adversarial policies against it)")
    total = sum(len(r["problems"]) for r in reports)
    if ok:
        print(f"{len(reports)} environment(s) OK")
        return 0
    print(f"{total} problem(s) in {sum(1 for r in reports if r['problems'])} environment(s)")
    return 1
