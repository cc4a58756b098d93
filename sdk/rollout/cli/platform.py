"""Platform verbs: push, envs, run, runs, show, compare (thin wrappers over the Client)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from rollout.cli._common import env_ref, later, note_if_stale, print_json, shown_status
from rollout.cli.envtools import slug_of
from rollout.cli.experiments import run_config
from rollout.errors import RolloutError
from rollout.shared.envs.judged import NOTHING_SCORED, judges_nothing
from rollout.shared.settings import load_settings
from rollout.shared.stale import worst
from rollout.shared.stats import format_interval

if TYPE_CHECKING:
    from rollout.client import AsyncClient


def register(sub: argparse._SubParsersAction) -> None:
    """Add the platform verbs."""
    p = sub.add_parser("push", help="validate and register an environment file")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--slug", help="only this environment (when the file defines several)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _run(_push(a)))

    p = sub.add_parser("envs", help="list registered environments")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _run(_envs(a)))

    p = sub.add_parser(
        "run", help="run a model on an environment's tasks, or an experiment plan (--config)"
    )
    p.add_argument("slug", metavar="SLUG[@VERSION]", nargs="?")
    p.add_argument("--model", help="e.g. openai/gpt-4o-mini, hf:./model")
    p.add_argument(
        "--config", metavar="PLAN.toml", help="run an experiment plan stage by stage (resumes)"
    )
    p.add_argument(
        "--with",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=MODEL",
        help="(--config) use MODEL for the plan's model NAME",
    )
    p.add_argument("-n", "--n", type=int, default=1, help="rollouts per task")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tool-calls", type=int, default=16)
    p.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override one of the env's rollout budgets (max_turn_tokens, max_rollout_tokens, "
        "max_rollout_seconds, max_repeated_calls; 0 turns the repeat guard off); repeatable",
    )
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--name", default=None)
    p.add_argument("--split", default=None, help="only tasks of this split")
    p.add_argument("--batch-size", type=int, default=16, help="rollouts per work item")
    p.add_argument("--deadline", type=float, default=3600.0, help="seconds before the run fails")
    p.add_argument("--env-version", type=int, default=None)
    p.add_argument("--follow", "-f", action="store_true", help="show progress until it finishes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _run(_run_cmd(a)))

    p = sub.add_parser("runs", help="list recent runs")
    p.add_argument("--limit", type=int, default=20, help=f"at most this many (1-{MAX_LIMIT})")
    p.add_argument("--env", default=None, help="only runs of this environment")
    p.add_argument("--mine", action="store_true", help="only runs this key started")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _run(_runs(a)))

    p = sub.add_parser("show", help="one run: summary and per-task table")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--rollouts", action="store_true", help="include every rollout")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _run(_show(a)))

    p = sub.add_parser(
        "cancel",
        help="stop a run (its unstarted work is skipped) or a training job (at its next step)",
    )
    later(p, _cancel_arguments)
    p.set_defaults(func=lambda a: _run(_cancel(a)))

    p = sub.add_parser(
        "compare",
        help="compare two runs: pass rates with 95%% intervals, the delta's interval, per task",
    )
    later(p, _compare_arguments)
    p.set_defaults(func=lambda a: _run(_compare(a)))


def _cancel_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `cancel` (its help names the job ids' prefix, from the models)."""
    from rollout.shared.models.trained import JOB_PREFIX

    p.add_argument("run_id", metavar="RUN_OR_JOB", help=f"a run id, or a job id ({JOB_PREFIX}...)")
    p.add_argument("--reason", default=None, help="why, kept in the run's history (<= 500 chars)")
    p.add_argument("--json", action="store_true")


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `compare` (its help says when the comparison refuses)."""
    from rollout.comparison import MOSTLY_ERRORED

    p.add_argument("base", metavar="BASE")
    p.add_argument("other", metavar="OTHER")
    p.add_argument(
        "--allow-errored",
        action="store_true",
        help=f"print the delta even when over {MOSTLY_ERRORED:.0%}% of a run's rollouts errored"
        " (refused otherwise: it would measure the errors)",
    )
    p.add_argument("--json", action="store_true")


# The tracker lists at most this many runs or jobs at once (and would cut a bigger ask short).
MAX_LIMIT = 1000


def check_limit(limit: int) -> int:
    """`--limit` when it is 1..MAX_LIMIT; RolloutError naming the flag otherwise."""
    if not 1 <= limit <= MAX_LIMIT:
        raise RolloutError(f"--limit: must be between 1 and {MAX_LIMIT}, got {limit}")
    return limit


def _run(coro: Any) -> int:
    return asyncio.run(coro)


async def _with_client(fn: Any) -> Any:
    from rollout.client import AsyncClient

    client = AsyncClient()
    try:
        return await fn(client)
    finally:
        await client.close()


async def _push(args: argparse.Namespace) -> int:
    from rollout.shared.audit.static import verifier_warnings
    from rollout.shared.envs.loader import load_environments, select_environment
    from rollout.shared.envs.starts import check_starts
    from rollout.shared.envs.validation import validate_environment

    envs = select_environment(load_environments(args.file), args.slug)
    slugs = Counter(slug_of(e) for e in envs)
    # As `rollout plan` says: two environments of one slug would push as two versions of one.
    lines = [
        f"{slug}: slug {slug!r} is used by {n} environments"
        for slug, n in slugs.items()
        if n > 1 and slug
    ]
    unchecked: list[str] = []  # tasks the start check ran out of time before
    for e in envs:
        problems = validate_environment(e)
        # As `rollout plan` says: a plugin whose episodes cannot start errors their rollouts
        # (in a thread: closing a runtime runs a loop of its own).
        if not problems:
            check = await asyncio.to_thread(check_starts, e.to_spec())
            problems = check.problems
            unchecked += [f"{e.slug}: {w}" for w in check.warnings]
        lines += [f"{e.slug}: {p}" for p in problems]
    for w in unchecked if lines else ():  # refused: still say what was not looked at
        print(f"warning: {w}", file=sys.stderr)
    if lines:
        raise RolloutError(f"{args.file}: not pushed, fix these first", problems=lines)

    # Pushed all the same: warnings name what the verifier lets through, by config path, and
    # the tasks whose episodes were not started.
    warnings = [f"{e.slug}: {w}" for e in envs for w in verifier_warnings(e.to_spec())]
    warnings += unchecked
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)

    async def push(client: AsyncClient) -> list[dict[str, Any]]:
        done: list[dict[str, Any]] = []
        for e in envs:
            try:
                done.append(await client.push_environment(e))
            except RolloutError as exc:
                if not done:
                    raise
                # The ones before it are registered: an error alone read as "nothing pushed".
                kept = ", ".join(
                    f"{r['slug']} v{r['version']} {'registered' if r['created'] else 'unchanged'}"
                    for r in done
                )
                raise RolloutError(
                    exc.message, problems=[*exc.problems, f"pushed before it: {kept}"]
                ) from None
        return done

    results = await _with_client(push)
    if args.json:
        print_json({"environments": results, "warnings": warnings})
        return 0
    for r in results:
        state = "registered" if r["created"] else "unchanged"
        print(f"✓ {r['slug']} v{r['version']} {state} ({r['template']}, {r['task_count']} tasks,"
              f" sha256 {r['spec_hash'][:12]})")  # fmt: skip
    return 0


async def _envs(args: argparse.Namespace) -> int:
    envs = await _with_client(lambda c: c.list_environments())
    if args.json:
        print_json({"environments": envs})
        return 0
    if not envs:
        print("no environments yet: `rollout push FILE`")
        return 0
    print(f"{'SLUG':<28} {'VER':>4} {'TEMPLATE':<13} {'TASKS':>6}  HASH")
    for e in envs:
        print(f"{e['slug']:<28} {e['version']:>4} {e['template']:<13} {e['task_count']:>6}"
              f"  {e['spec_hash'][:12]}")  # fmt: skip
    return 0


async def _require_local_sandbox(client: AsyncClient, slug: str) -> None:
    """On the local stack (its verifier runs here), refuse a code-editing run without a sandbox."""
    from rollout.shared.envs.sandbox_required import require_sandbox

    if load_settings().external_nats:
        return  # the services run elsewhere; their sandbox is theirs to report
    envs = await client.list_environments()
    await require_sandbox({e["template"] for e in envs if e["slug"] == slug})


def budget_overrides(pairs: list[str]) -> dict[str, Any] | None:
    """`--budget NAME=VALUE` flags as a Budgets dict (None when none); RolloutError naming one."""
    from pydantic import ValidationError

    from rollout.shared.contracts.budgets import Budgets

    if not pairs:
        return None
    raw: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise RolloutError(
                f"--budget {pair!r}: expected NAME=VALUE, e.g. max_rollout_seconds=60"
            )
        raw[name.strip()] = value.strip()
    try:
        return Budgets.model_validate(raw).model_dump(exclude_none=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(p) for p in first["loc"])
        known = ", ".join(Budgets.model_fields)
        raise RolloutError(
            f"--budget {name}: {first['msg']}", problems=[f"budgets: {known}"]
        ) from None


async def _run_cmd(args: argparse.Namespace) -> int:
    # A plan names its own envs and models: SLUG or --model beside it would be ignored, and
    # --with without a plan has nothing to replace. Usage errors, exit 2 as argparse's are.
    from rollout.follow import follow_run

    if args.config and (args.slug or args.model):
        print("error: rollout run takes SLUG --model MODEL or --config PLAN.toml, not both"
              " (a plan's models are replaced with --with NAME=MODEL)", file=sys.stderr)  # fmt: skip
        return 2
    if args.overrides and not args.config:
        print("error: --with NAME=MODEL replaces a plan's model: it needs --config PLAN.toml",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.config:
        # On this loop, not a worker thread: Ctrl-C must reach the plan runner at once.
        return await run_config(args)
    if not args.slug or not args.model:
        # A usage error, exit 2 as argparse's own are.
        print(
            "error: rollout run needs SLUG and --model MODEL (or --config PLAN.toml)",
            file=sys.stderr,
        )
        return 2
    slug, version = env_ref(args.slug, args.env_version, "SLUG")

    async def go(client: AsyncClient) -> dict[str, Any]:
        await _require_local_sandbox(client, slug)
        run = await client.create_run(
            slug,
            args.model,
            args.n,
            temperature=args.temperature,
            max_tool_calls=args.max_tool_calls,
            budgets=budget_overrides(args.budget),
            max_tokens=args.max_tokens,
            seed=args.seed,
            name=args.name,
            split=args.split,
            batch_size=args.batch_size,
            deadline_s=args.deadline,
            env_version=version,
        )
        if not args.follow:
            return run
        if not args.json:
            print(f"run {run['runId']}: {slug} v{run['env_version']} × {args.model}")
        try:
            await follow_run(client, run["runId"], quiet=args.json)
        except asyncio.CancelledError:
            # Ctrl-C stops the following, not the run: say so, and how to stop it too.
            rid = run["runId"]
            print(f"\ninterrupted: run {rid} goes on (`rollout show {rid}` follows it up;"
                  f" `rollout cancel {rid}` stops it)", file=sys.stderr)  # fmt: skip
            raise
        # The final event is on the log; wait for the read model to show it too.
        done = await client.wait_for_run(run["runId"], timeout_s=60)
        return await with_errors(client, done)

    run = await _with_client(go)
    if args.follow:
        # The final summary came from the read models: say so when they are stalled behind.
        note_if_stale(run.get("readModels"))
    if args.json:
        print_json(run)
    elif args.follow:
        print_run(run)
    else:
        print(f"run {run['runId']} queued: {len(run['task_indices'])} tasks × {args.n}")
        print(
            f"  follow: rollout events --run {run['runId']} --follow   or   rollout show {run['runId']}"
        )
    errors = run.get("errorSummary")
    if errors and errors["allErrored"]:
        # "completed" with no verdict at all is a failure to measure anything: say why.
        first = errors.get("firstError")
        cause = f"; first error [{first['kind']}]: {first['message']}" if first else ""
        raise RolloutError(
            f"every rollout of run {run['runId']} errored ({errors['errored']} of "
            f"{errors['outOf']}), so nothing was measured{cause}"
        )
    return 0 if run.get("status") != "failed" else 1


async def with_errors(client: AsyncClient, run: dict[str, Any]) -> dict[str, Any]:
    """The run with `errorSummary` (None when no rollout errored).

    Uses the run's `rollouts` when it has them, else reads only its errored rollouts.
    """
    from rollout.comparison import error_summary, pass_rate_interval, run_design_effect

    errored: list[dict[str, Any]] = []
    if "rollouts" in run:
        errored = [r for r in run["rollouts"] if r.get("outcome") == "errored"]
    elif run.get("errored"):
        errored = await client.errored_rollouts(run["runId"], run["errored"])
    run["errorSummary"] = error_summary(run, errored)
    run["designEffect"] = run_design_effect(run)
    run["passRateInterval"] = pass_rate_interval(run)
    await _with_no_verdict(client, [run])
    return run


async def _with_no_verdict(client: AsyncClient, runs: list[dict[str, Any]]) -> None:
    """Take out the pass rate, interval and mean score of the runs whose env judges nothing (a
    prompts file without answers): their 100% measured nothing, and `noVerdict` says why.

    The tracker says which (`noVerdict` on each run, decided once per env version); only a
    reply from a tracker older than that, without the key, has its env's spec read here.
    """
    unsaid = {(r["envSlug"], r["envVersion"]) for r in runs if "noVerdict" not in r}

    async def spec(slug: str, version: int) -> Any:
        try:
            doc = await client.get_environment(slug, version)
        except RolloutError:  # not readable here: its verdicts are shown as they are
            return None
        return doc.get("spec", doc)

    specs = await asyncio.gather(*(spec(*v) for v in unsaid))
    empty = {v for v, s in zip(unsaid, specs, strict=True) if s and judges_nothing(s)}
    for r in runs:
        if "noVerdict" not in r:
            r["noVerdict"] = NOTHING_SCORED if (r["envSlug"], r["envVersion"]) in empty else None
        if r["noVerdict"]:
            r.update(passRate=None, passRateInterval=None, meanScore=None)


async def _runs(args: argparse.Namespace) -> int:
    from rollout.comparison import pass_rate_interval
    from rollout.shared.auth.ownership import describe as describe_user

    check_limit(args.limit)

    async def fetch(client: AsyncClient) -> list[dict[str, Any]]:
        owner = await client.caller() if args.mine else None
        listing = await client.runs_listing(args.limit, args.env, owner=owner)
        runs = listing["runs"]
        if not runs and args.env:
            # No runs of a slug that names no environment: a typo, not an empty history.
            if args.env not in {e["slug"] for e in await client.list_environments()}:
                raise RolloutError(f"--env: no environment {args.env!r} (see `rollout envs`)")
        await _with_no_verdict(client, runs)
        return listing

    listing = await _with_client(fetch)
    runs, read_models = listing["runs"], listing["readModels"]
    # First: a `rollout runs | head` still sees it.
    note_if_stale(read_models)
    for r in runs:
        # As `rollout show` gives it (None with no verdict), from the tracker's design effect.
        if not r.get("noVerdict"):
            r["passRateInterval"] = pass_rate_interval(r)
    if args.json:
        print_json({"runs": runs, "readModels": read_models})
        return 0
    if not runs:
        if args.env:
            print(f"no runs of {args.env} yet: `rollout run {args.env} --model M`")
        else:
            print("no runs yet: `rollout run SLUG --model M`")
        return 0
    print(f"{'RUN':<17} {'ENV':<22} {'MODEL':<26} {'STATUS':<10} {'DONE':>9} {'PASS':>6}"
          f" {'95% CI':<12} {'ERR':>5}  BY")  # fmt: skip
    for r in runs:
        done = f"{r['scored']}/{r['total']}"
        # Errored rollouts have no verdict: a run with none judged has no pass rate, and
        # neither has one whose verdicts judged nothing.
        judged = r["scored"] > r["errored"] and not r.get("noVerdict")
        rate = f"{r['passRate']:.0%}" if judged else "-"
        # A pass rate is never shown bare: its interval, as `rollout show` gives it.
        interval = r["passRateInterval"]
        ci = format_interval(tuple(interval)) if interval else "-"
        by = describe_user(r["owner"]) if r.get("owner") else "-"
        print(f"{r['runId']:<17} {r['envSlug'][:22]:<22} {r['model'][:26]:<26}"
              f" {shown_status(r):<10} {done:>9} {rate:>6} {ci:<12} {r['errored']:>5}"
              f"  {by}")  # fmt: skip
    if any(r.get("noVerdict") for r in runs):
        print(f"(PASS -: {NOTHING_SCORED})")
    return 0


def print_run(run: dict[str, Any]) -> None:
    """Human summary of a run and its per-task table."""
    from rollout.shared.auth.ownership import describe as describe_user

    status = "waiting" if run.get("waiting") else run["status"]
    print(f"run {run['runId']}  {status}  {run['envSlug']} v{run['envVersion']}"
          f"  model {run['model']}  n={run['n']}")  # fmt: skip
    if run.get("waiting"):
        print("  waits for its owner's earlier runs: a key has at most ROLLOUT_RUNS_PER_OWNER"
              " runs under way (the tracker's setting, 8 by default); its deadline starts"
              " when it does")  # fmt: skip
    if run.get("owner"):
        print(f"  started by {describe_user(run['owner'])}")
    if run.get("source"):
        print(f"  rewards imported from {run['source']}: recorded there, not verified here"
              f" (`rollout replay {run['runId']} --reverify` re-scores them)")  # fmt: skip
    errors = run.get("errorSummary")
    if run.get("reason") and not (errors and errors["allErrored"]):
        # A run failed for its errors has them listed by kind below, its reason among them.
        print(f"  reason: {run['reason']}")
    # Rates are over verdicts: errored rollouts (no verdict) are counted on their own, and
    # with no verdict at all there is no rate (the read model's 0.0 would read as one).
    # Nor is there one when the verdicts judged nothing (a prompts file without answers).
    verdicts = 0 if run.get("noVerdict") else run["scored"] - run["errored"]
    rate = f"{run['passRate']:.1%}" if verdicts > 0 else "-"
    if verdicts > 0 and run.get("passRateInterval"):
        # A pass rate is never shown bare: its 95% interval, as `rollout compare` counts it.
        rate += f" {format_interval(tuple(run['passRateInterval']))}"
    score = f"{run['meanScore']:.3f}" if verdicts > 0 else "-"
    passed = run["passed"]
    failed = run.get("failed", run["scored"] - run["passed"] - run["errored"])
    if run.get("noVerdict"):
        passed = failed = "-"  # what passed or failed was never checked
    print(f"  scored {run['scored']}/{run['total']}  passed {passed}  failed {failed}"
          f"  errored {run['errored']}"
          f"  pass rate {rate}  mean score {score}")  # fmt: skip
    if run.get("noVerdict"):
        print(f"  no pass rate: {run['noVerdict']}")
    if errors:
        print_errors(errors)
    if run.get("endedBy"):
        # How the rollouts ended: the model finished them, or which budget did.
        ended = ", ".join(f"{k} {v}" for k, v in sorted(run["endedBy"].items()))
        print(f"  ended by: {ended}  mean turns {run['meanTurns']:.1f}"
              f"  mean new tokens {run['meanCompletionTokens']:.0f}")  # fmt: skip
    if run.get("tasks"):
        print(f"  {'TASK':>5} {'N':>4} {'PASS':>6} {'SCORE':>7} {'ERR':>4}")
        for t in run["tasks"]:
            # Every rollout of the task errored: no verdict, so no rate (not 0%).
            none = t["errored"] >= t.get("scored", t["n"]) and t["errored"] > 0
            none = none or bool(run.get("noVerdict"))  # or its verdicts judged nothing
            rate = "-" if none else f"{t['passRate']:.0%}"
            score = "-" if none else f"{t['meanScore']:.3f}"
            print(f"  {t['taskIndex']:>5} {t['n']:>4} {rate:>6}"
                  f" {score:>7} {t['errored']:>4}")  # fmt: skip


def print_errors(errors: dict[str, Any], indent: str = "  ") -> None:
    """The error kinds of a run's errored rollouts, each with its count and one message."""
    from rollout.comparison import first_line

    if errors["allErrored"]:
        print(f"{indent}every rollout errored ({errors['errored']} of {errors['outOf']}):"
              " no verdict, so the pass rate measures nothing")  # fmt: skip
    else:
        print(f"{indent}{errors['errored']} of {errors['outOf']} rollouts errored"
              " (no verdict: left out of the pass rate)")  # fmt: skip
    for kind in errors["kinds"]:
        print(f"{indent}  {kind['kind']} {kind['count']}: {first_line(kind['sample'])}")
    if not errors["complete"]:
        read = sum(k["count"] for k in errors["kinds"])
        print(f"{indent}  (kinds of the {read} errored rollouts read; `rollout show RUN"
              " --rollouts` lists every one)")  # fmt: skip


async def _show(args: argparse.Namespace) -> int:
    async def fetch(client: AsyncClient) -> dict[str, Any]:
        run = await client.get_run(args.run_id, include_rollouts=args.rollouts)
        return await with_errors(client, run)

    run = await _with_client(fetch)
    note_if_stale(run.get("readModels"))
    if args.json:
        print_json(run)
        return 0
    print_run(run)
    verdicts = {"passed": "PASS", "failed": "FAIL", "errored": "ERR ", None: "... "}
    for r in run.get("rollouts", []):
        verdict = verdicts.get(r.get("outcome"), "?   ")
        # An errored rollout has no score: what broke (infra/env/model) and why instead.
        score = "-" if r.get("outcome") in ("errored", None) else r["score"]
        if run.get("noVerdict") and r.get("outcome") in ("passed", "failed"):
            verdict, score = "-   ", "-"  # a verdict that judged nothing
        cause = f"[{r['errorKind']}] {r['error']}" if r.get("errorKind") else (r["error"] or "")
        print(f"    {r['rolloutId']}  task {r['taskIndex']} #{r['sampleIndex']}  {verdict}"
              f"  {score}  {cause}")  # fmt: skip
    return 0


async def _cancel(args: argparse.Namespace) -> int:
    from rollout.shared.models.trained import JOB_PREFIX

    job = args.run_id.startswith(JOB_PREFIX)

    async def cancel(client: AsyncClient) -> dict[str, Any]:
        if job:
            return await client.cancel_training_job(args.run_id, args.reason)
        return await client.cancel_run(args.run_id, args.reason)

    ended = await _with_client(cancel)
    if args.json:
        print_json(ended)
        return 0
    if job:
        print(f"job {ended['jobId']} {ended['reason']}")
        print(
            "  a running job stops at its next step, a queued one never starts; its runs still"
            " going are cancelled with it"
        )
    else:
        print(f"run {ended['runId']} {ended['reason']}")
        print("  its work items under way stop, and the queued ones are skipped")
    return 0


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _rate(side: dict[str, Any], key: str, spec: str) -> str:
    """A side's rate or score; `-` when it has no verdict (every rollout errored)."""
    return "-" if side.get("judged", side["scored"]) == 0 else format(side[key], spec)


def _delta(value: float | None, pct: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value:+.0%}" if pct else f"{value:+.3f}"


def _interval(value: list[float] | None) -> str:
    """A difference's interval, `-` when there is no difference (a side has no verdict)."""
    return "-" if value is None else format_interval(value, signed=True)


def print_comparison(result: dict[str, Any], *, per_task: bool = True) -> None:
    """The compare table: pass rates with 95% intervals, the delta's interval, per-task rows."""
    base, other = result["base"], result["other"]
    for warning in result.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    if not result.get("measured", True):
        sides = " and ".join(result.get("mostlyErrored", []))
        print(f"warning: NOT A MEASUREMENT: most rollouts of {sides} errored; the delta below"
              " compares errors, not models", file=sys.stderr)  # fmt: skip
    print(f"{'':<10} {'BASE':>12} {'OTHER':>12} {'DELTA':>8}")
    print(f"{'run':<10} {base['runId']:>12.12} {other['runId']:>12.12}")
    print(f"{'pass rate':<10} {_rate(base, 'passRate', '.0%'):>12}"
          f" {_rate(other, 'passRate', '.0%'):>12}"
          f" {_delta(result['deltaPassRate']):>8}")  # fmt: skip
    print(f"{'95% CI':<10} {format_interval(base['passRateInterval']):>12}"
          f" {format_interval(other['passRateInterval']):>12}"
          f" {_interval(result['deltaPassRateInterval']):>8}")  # fmt: skip
    print(f"{'score':<10} {_rate(base, 'meanScore', '.3f'):>12}"
          f" {_rate(other, 'meanScore', '.3f'):>12}"
          f" {_delta(result['deltaScore'], False):>8}")  # fmt: skip
    paired = result.get("deltaPassRatePairedInterval")
    if paired is not None:
        print(f"{'paired CI':<10} {'':>12} {'':>12} {format_interval(paired, signed=True):>8}")
    errored = (base.get("errored") or 0) + (other.get("errored") or 0)
    print(f"(95% Wilson intervals over {base.get('judged', base['scored'])} and"
          f" {other.get('judged', other['scored'])} scored rollouts"
          + (f", {errored} errored left out" if errored else "") +
          "; the delta's is Newcombe's" + ("; paired: the same tasks, one rollout each, "
          "Newcombe's paired method" if paired is not None else "") + ")")  # fmt: skip
    effects = [(s, x["designEffect"]) for s, x in (("base", base), ("other", other))
               if (x.get("designEffect") or 1.0) > 1.0]  # fmt: skip
    if effects:
        # Samples of one task move together: fewer independent trials than rollouts.
        said = ", ".join(
            f"{side}'s {result[side]['judged']} rollouts as {result[side]['judged'] / effect:.0f}"
            for side, effect in effects
        )
        print(f"(samples of a task are correlated: counted as independent trials, {said})")
    if not per_task:
        return
    print(f"\n{'TASK':>5} {'BASE':>7} {'OTHER':>7} {'DELTA':>7}")
    for row in result["tasks"]:
        print(f"{row['taskIndex']:>5} {_pct(row['basePassRate']):>7} {_pct(row['otherPassRate']):>7}"
              f" {_delta(row['deltaPassRate']):>7}")  # fmt: skip


async def _compare(args: argparse.Namespace) -> int:
    from rollout.comparison import MOSTLY_ERRORED, comparison, error_line

    async def both(client: AsyncClient) -> tuple[dict, dict]:
        base = await with_errors(client, await client.get_run(args.base))
        return base, await with_errors(client, await client.get_run(args.other))

    base, other = await _with_client(both)
    result = comparison(base, other)
    result["readModels"] = worst(base.get("readModels"), other.get("readModels"))
    note_if_stale(result["readModels"])
    unscored = result["unscored"]
    # A side with no verdict has no rate to print, --allow-errored or not.
    refused = bool(unscored) or (not result["measured"] and not args.allow_errored)
    if args.json:
        print_json(result)
    elif refused:
        # No table: a delta between errors reads as a measured change. The other warnings
        # (the mostly errored sides are in the error below).
        said = tuple(
            f"{side} {result[side]['runId']}: " for side in (*result["mostlyErrored"], *unscored)
        )
        for warning in result["warnings"]:
            if not warning.startswith(said):
                print(f"warning: {warning}", file=sys.stderr)
    else:
        print_comparison(result)
    if unscored:
        # A run cancelled or compared before it scored anything read as 0%: a -100 point delta.
        why = "; ".join(
            f"{side} {result[side]['runId']}: {result[side]['noVerdict']}" for side in unscored
        )
        raise RolloutError(
            f"not comparable: {why}",
            problems=["compare runs that scored rollouts (`rollout show RUN` gives its progress)"],
        )
    if refused:
        # Refused (exit 1), not only warned: a script or a CI job reads the exit status and
        # the numbers, and would take a -100 point "regression" for a model that was down.
        why = "; ".join(
            f"{side} {result[side]['runId']}: {error_line(result[side]['errorSummary'])}"
            for side in result["mostlyErrored"]
        )
        raise RolloutError(
            f"not comparable: over {MOSTLY_ERRORED:.0%} of the rollouts errored ({why})",
            problems=[
                "fix the cause and run again (`rollout show RUN --rollouts` lists each error)",
                "or pass --allow-errored to print the delta anyway",
            ],
        )
    return 0
