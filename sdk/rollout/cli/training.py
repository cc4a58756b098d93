"""Training verbs: `improve` (start a job), `jobs` (list them), `job ID` (one, or follow it)."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.cli._common import later, note_judges_nothing, print_json, shown_status
from rollout.cli.platform import MAX_LIMIT, check_limit
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.envs.judged import judges_nothing
from rollout.shared.method_names import METHOD_ALIASES, method_names

if TYPE_CHECKING:
    from rollout.client import AsyncClient


def register(sub: argparse._SubParsersAction) -> None:
    """Add the training verbs."""
    # The built-in methods: the table itself imports every trainer (its registered methods are
    # in `improve --help`).
    offline, online = _listed(method_names)
    p = sub.add_parser(
        "improve",
        help=f"fine-tune a model on a run's rollouts ({offline}) or online on an env ({online})",
    )
    later(p, _improve_arguments)
    p.set_defaults(func=lambda a: _run(_improve(a)))

    p = sub.add_parser("jobs", help="list training jobs")
    p.add_argument("--limit", type=int, default=20, help=f"at most this many (1-{MAX_LIMIT})")
    p.add_argument("--mine", action="store_true", help="only jobs this key started")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _run(_jobs(a)))

    p = sub.add_parser("job", help="one training job: status, step, loss, reward, tokens/s, ETA")
    p.add_argument("job_id", metavar="ID")
    p.add_argument("--follow", "-f", action="store_true", help="show progress until it ends")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: _run(_job(a)))


def _listed(names: Callable[..., tuple[str, ...]]) -> tuple[str, str]:
    """The offline methods (aliases too) and the online ones, as help text lists them."""
    offline = ", ".join((*names(online=False), *METHOD_ALIASES))
    return offline, ", ".join(names(online=True))


def _improve_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `improve`: its --method help is the training table's."""
    from rollout.shared.learning import methods

    offline, online = _listed(methods.names)
    p.add_argument("--run", dest="run_id", help=f"source run ({offline})")
    p.add_argument(
        "--dataset",
        type=Path,
        metavar="FILE|DIR",
        help="train on a dataset snapshot (`rollout export`: .jsonl, .parquet or an hf folder) "
        f"instead of a run ({offline}); every row is checked before the job starts",
    )
    p.add_argument("--model", required=True, help="base model, e.g. local/tiny-agent, hf:DIR")
    p.add_argument(
        "--method",
        choices=(*methods.names(), *METHOD_ALIASES),
        default="sft",
        help=", ".join(f"{m.name} ({m.title})" for m in methods.TABLE.values())
        + "".join(
            f"; {a}: {r} with " + ", ".join(f"{k}={v}" for k, v in fixed.items())
            for a, (r, fixed) in METHOD_ALIASES.items()
        )
        + "; settings (--set KEY=VALUE): schemas/training_config.json",
    )
    p.add_argument("--suffix", help="trained model name is MODEL:SUFFIX (default: the job id)")
    p.add_argument("--epochs", type=float)
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--batch-size", type=int)
    # Two flags of their own (not one dest), so that both given together can be refused.
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter")
    p.add_argument(
        "--full-finetune",
        action="store_true",
        help="train every weight (local/smollm2-135m trains a LoRA adapter by default)",
    )
    p.add_argument(
        "--env",
        dest="env_slug",
        help=f"environment to train on online ({online}); with --run, the run's own env only",
    )
    p.add_argument(
        "--steps",
        type=int,
        help=f"optimizer steps ({online}: policy versions; {offline}: a cap instead of --epochs)",
    )
    p.add_argument("-n", "--group-size", type=int, help=f"rollouts per task and step ({online})")
    p.add_argument("--max-staleness", type=int, help=f"oldest policy version trained on ({online})")
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other hyperparameter (repeatable), e.g. --set save_every=10",
    )
    p.add_argument(
        "--include-held-out",
        action="store_true",
        help=f"also train on the run's held-out tasks ({offline}; left out by default, so a "
        "test run measures tasks the model never trained on)",
    )
    p.add_argument("--follow", "-f", action="store_true", help="show progress until it ends")
    p.add_argument("--json", action="store_true")


def _run(coro: Any) -> int:
    return asyncio.run(coro)


def _value(text: str) -> Any:
    """A --set value: JSON-ish literals become numbers and booleans, the rest stays text."""
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


# Each hyperparameter flag: its argparse dest, its name on the command line, its setting.
_FLAGS = (
    ("epochs", "--epochs", "epochs"),
    ("learning_rate", "--learning-rate", "learning_rate"),
    ("batch_size", "--batch-size", "batch_size"),
    ("lora", "--lora/--full-finetune", "lora"),
    ("steps", "--steps", "max_steps"),
    ("group_size", "--group-size", "group_size"),
    ("max_staleness", "--max-staleness", "max_staleness"),
)


def _lora(args: argparse.Namespace) -> bool | None:
    """--lora True, --full-finetune False, neither None (the base model's default)."""
    if args.lora and args.full_finetune:
        raise RolloutError("--lora and --full-finetune contradict each other: give one")
    return True if args.lora else False if args.full_finetune else None


def hyperparams(args: argparse.Namespace) -> dict[str, Any]:
    """The hyperparameters the flags ask for (only those given)."""
    out: dict[str, Any] = {}
    for dest, flag, key in _FLAGS:
        value = _lora(args) if dest == "lora" else getattr(args, dest)
        if value is not None:
            out[key] = _sendable(value, flag)
    for item in args.settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise RolloutError(f"--set {item!r}: expected KEY=VALUE")
        out[key.strip()] = _sendable(_value(value.strip()), f"--set {key.strip()}")
    return out


# The learner reads numbers from JSON as 64-bit integers and finite floats.
_INT64 = 2**63


def _sendable(value: Any, flag: str) -> Any:
    """`value`, or a RolloutError naming `flag` when the learner could not read it as given."""
    if (problem := _unsendable(value)) is not None:
        raise RolloutError(f"{flag}: {problem}")
    return value


def _unsendable(value: Any) -> str | None:
    """Why `value` cannot reach the learner as given, or None.

    JSON has no NaN or infinity (they arrive as null, refused as "got None"), and an integer
    past 64 bits fails to parse there ("exceeded maximum size"): said here, by flag, instead.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64:
        return f"{value} is out of range (a 64-bit integer at most)"
    if isinstance(value, list | tuple):
        return next((p for v in value if (p := _unsendable(v)) is not None), None)
    if isinstance(value, dict):
        return next((p for v in value.values() if (p := _unsendable(v)) is not None), None)
    return None


def check_flags(args: argparse.Namespace) -> None:
    """Refuse flags the method ignores or that contradict each other, naming the flag."""
    from rollout.shared.learning import methods

    method = methods.get(args.method)
    online = method.online
    kind = "online on --env" if online else "offline on a run's rollouts or a dataset"
    if args.dataset is not None and (online or args.run_id):
        what = f"--method {args.method} trains online" if online else "--run names a run"
        raise RolloutError(f"--dataset: {what}; give either a dataset or a run")
    if online and args.run_id:
        # Ignored, it would still be recorded as the job's source run: a false lineage.
        raise RolloutError(
            f"--run: --method {args.method} trains online on --env, sampling its own rollouts;"
            f" it reads no run (train on a run's rollouts with {_offline_names()})"
        )
    if not online and not args.run_id and args.dataset is None:
        raise RolloutError(f"--run RUN or --dataset FILE is required for --method {args.method}")
    if online and not args.env_slug:
        raise RolloutError(f"--env SLUG is required for --method {args.method}")
    if online and args.include_held_out:
        # Online jobs sample the env's train tasks only: the flag would be recorded, not obeyed.
        raise RolloutError(
            f"--include-held-out: --method {args.method} trains online on --env's train tasks;"
            f" it applies to a run's or a dataset's rollouts ({_offline_names()})"
        )
    _lora(args)
    # A flag the method has no setting for (--group-size with sft, --epochs with grpo).
    fields = method.config.model_fields
    for dest, flag, key in _FLAGS:
        given = _lora(args) if dest == "lora" else getattr(args, dest)
        if given is not None and key not in fields:
            raise RolloutError(f"{flag}: --method {args.method} trains {kind}; it has no {key}")
    if args.steps is not None and args.epochs is not None:
        raise RolloutError(
            "--steps and --epochs contradict each other: --steps stops training after that many "
            "optimizer steps whatever --epochs says; give one"
        )


def _offline_names() -> str:
    from rollout.shared.learning import methods

    return _listed(methods.names)[0]


async def _check_run_env(client: AsyncClient, args: argparse.Namespace) -> None:
    """An offline job on a run trains on that run's env: refuse an --env naming another."""
    from rollout.shared.learning import methods

    if not args.run_id or not args.env_slug or methods.get(args.method).online:
        return
    try:
        run = await client.get_run(args.run_id)
    except RolloutError as exc:
        raise RolloutError(f"--run {args.run_id}: {exc}") from None
    if run["envSlug"] != args.env_slug:
        # The job's lineage would say it trained on --env's env: it trains on the run's.
        raise RolloutError(
            f"--env {args.env_slug}: run {args.run_id} is of {run['envSlug']}, and "
            f"--method {args.method} trains on the run's rollouts; leave --env out or give "
            f"--env {run['envSlug']}"
        )


async def _note_run_judges_nothing(client: AsyncClient, run_id: str, method: str) -> None:
    """Say on stderr when the run's env judges nothing: its "passing" rollouts (what sft
    trains on, what dpo and kto prefer) only ended without a tool error."""
    try:
        run = await client.get_run(run_id, include_tasks=False)
        if "noVerdict" in run:  # the tracker says (once per env version)
            unjudged = bool(run["noVerdict"])
        else:  # a tracker older than `noVerdict`: its env's spec says
            doc = await client.get_environment(run["envSlug"], run["envVersion"])
            unjudged = judges_nothing(doc.get("spec", doc))
    except RolloutError:  # not readable here: the job goes on as asked, unremarked
        return
    if unjudged:
        env = f"{run['envSlug']}@{run['envVersion']}"
        note_judges_nothing(f"--method {method} learns from the verdicts of run {run_id}", [env])


def with_flags(exc: RolloutError, method: str) -> RolloutError:
    """The learner's `hyperparams.KEY: ...` problems, each with the flag that sets KEY."""
    flags = {key: flag for _, flag, key in _FLAGS}
    problems = []
    for problem in exc.problems:
        path, sep, said = problem.partition(":")
        head, dot, rest = path.partition(".")
        key = rest.split(".")[0]
        if sep and dot and head == "hyperparams" and "--" not in problem:
            # The learner names its settings; the user typed flags (or --set).
            if said.strip() == "unknown setting":
                problem += f" (--set {key}: --method {method} has no such setting)"
            else:
                problem += f" ({flags.get(key, f'--set {key}=VALUE')})"
        problems.append(problem)
    return RolloutError(exc.message, problems=problems)


async def _improve(args: argparse.Namespace) -> int:
    from rollout.client import AsyncClient
    from rollout.follow import follow_job

    check_flags(args)
    params = hyperparams(args)  # refused before any connection, as the flags are
    client = AsyncClient()
    try:
        await _check_run_env(client, args)
        if args.run_id:
            # Said up front, as the held-out tasks left out are.
            await _note_run_judges_nothing(client, args.run_id, args.method)
        try:
            job = await client.create_training_job(
                base_model=args.model,
                method=args.method,
                source_run_id=args.run_id,
                suffix=args.suffix,
                hyperparams=params,
                env_slug=args.env_slug,
                dataset=args.dataset,
                include_held_out=args.include_held_out,
            )
        except RolloutError as exc:
            raise with_flags(exc, args.method) from None
        if (held := job.get("heldOutTasksExcluded")) and not args.json:
            # Said up front: the run scored tasks the job will not learn from.
            source = f"run {args.run_id}" if args.run_id else f"dataset {args.dataset}"
            print(f"  left out {held} held-out task(s) of {source} (--include-held-out"
                  " to train on them)")  # fmt: skip
        if args.follow:
            if not args.json:
                print(f"job {job['id']}: {args.method} of {args.model} -> {job['model']}")
            try:
                job = await follow_job(client, job["id"], quiet=args.json)
            except asyncio.CancelledError:
                # Ctrl-C stops the following, not the job: say so, and how to stop it too.
                jid = job["id"]
                print(f"\ninterrupted: job {jid} goes on (`rollout job {jid} --follow` follows"
                      f" it again; `rollout cancel {jid}` stops it)", file=sys.stderr)  # fmt: skip
                raise
    finally:
        await client.close()
    if args.json:
        print_json(job)
    elif args.follow:
        print_job(job)
    else:
        what = (
            f"run {args.run_id}" if args.run_id
            else f"dataset {args.dataset}" if args.dataset
            else f"env {args.env_slug}"
        )  # fmt: skip
        print(f"job {job['id']} queued: {args.method} of {args.model} on {what}")
        print(f"  model when done: {job['model']}  (or the job id {job['id']})")
        print(f"  follow: rollout job {job['id']} --follow")
    return 0 if job.get("status") != "failed" else 1


async def _jobs(args: argparse.Namespace) -> int:
    from rollout.client import AsyncClient
    from rollout.follow import num

    check_limit(args.limit)
    client = AsyncClient()
    try:
        owner = await client.caller() if args.mine else None
        jobs = await client.list_training_jobs(args.limit, owner=owner)
    finally:
        await client.close()
    if args.json:
        print_json({"jobs": jobs})
        return 0
    if not jobs:
        print("no training jobs yet: `rollout improve --run RUN --model MODEL`")
        return 0
    print(f"{'JOB':<21} {'METHOD':<6} {'STATUS':<10} {'STEP':>9} {'LOSS':>8}  MODEL")
    for j in jobs:
        step = f"{j['step']}/{j['totalSteps']}" if j["totalSteps"] else "-"
        model = j["modelId"] or j["baseModel"]
        print(f"{j['id']:<21} {j['method']:<6} {shown_status(j):<10} {step:>9}"
              f" {num(j['loss']):>8}  {model}")  # fmt: skip
    return 0


async def _job(args: argparse.Namespace) -> int:
    from rollout.client import AsyncClient
    from rollout.follow import follow_job

    try:
        subjects.token(args.job_id, "job id")
    except subjects.SubjectError as exc:
        raise RolloutError(str(exc)) from None  # one `error:` line, as `show` gives
    client = AsyncClient()
    try:
        if args.follow:
            job = await follow_job(client, args.job_id, quiet=args.json)
        else:
            job = await client.get_training_job(args.job_id)
    finally:
        await client.close()
    if args.json:
        print_json(job)
    else:
        print_job(job)
    return 0 if job.get("status") != "failed" else 1


def print_job(job: dict[str, Any]) -> None:
    """Human summary of a training job."""
    from rollout.follow import eta, num
    from rollout.shared.auth.ownership import describe as describe_user

    # A cancelled job is stored as failed: said as `rollout jobs` lists it.
    print(f"job {job['id']}  {shown_status(job)}  {job['method']} of {job['baseModel']}")
    if job.get("owner"):
        print(f"  started by {describe_user(job['owner'])}")
    if job.get("sourceRunId"):
        print(f"  source run {job['sourceRunId']}")
    if job.get("envSlug"):
        print(f"  environment {job['envSlug']}")
    step = f"{job['step']}/{job['totalSteps']}" if job.get("totalSteps") else "-"
    # The ETA is the last step's guess: once the job has ended, nothing is left to wait for.
    left = f"  ETA {eta(job.get('etaS'))}" if job["status"] in ("queued", "running") else ""
    print(f"  step {step}  loss {num(job.get('loss'))}  reward {num(job.get('reward'))}"
          f"  tokens/s {num(job.get('tokensPerS'), '.0f')}{left}")  # fmt: skip
    if job.get("modelId"):
        print(f"  model {job['modelId']}  (also: {job['id']})")
    if job.get("reason"):
        print(f"  reason: {job['reason']}")
