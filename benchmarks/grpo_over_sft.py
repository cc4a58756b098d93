"""Does GRPO add over SFT on the real model? The demo's two learning stages, in one process.

`rollout demo --model local/smollm2-135m` measures one SFT -> GRPO path through the platform
(about ten minutes). Whether GRPO *reliably* adds over SFT needs several GRPO paths from the same
SFT'd model, so this script runs the demo's stages without the services, on the same code:

1. SFT (TRL, LoRA) on the scripted demonstrations of the first `--sft-tasks` train tasks,
   exactly as the demo selects them; once, cached under `--work`;
2. the SFT'd model, greedy, on the test split (the baseline GRPO has to beat);
3. per `--seeds`: online GRPO from the SFT adapter (`GRPOLearner`, the learner service's
   class) for `--steps` steps, each on `--tasks-per-step` train tasks x `--group-size`
   samples drawn by the hf backend from the current policy (synchronous: max_staleness 0),
   then the test split again, greedy.

It prints, per seed, the test pass rate after GRPO and the difference to SFT with the paired
95% interval (same tasks, greedy: each task is a pair), and in the end how many seeds GRPO
helped, hurt or left alone. Numbers are measured; nothing is assumed.

Run: `python benchmarks/grpo_over_sft.py --seeds 0 1 2 [--steps N] [--lr X] [--json]` (defaults: the
stage settings of the demo's plan, sdk/rollout/cli/demo.toml: the recipe for local/smollm2-135m).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENV_FILE = ROOT / "examples" / "ticket_routing.py"
# The in-process rows' run id (the buffer groups by run and task).
RUN_ID = "grpo-over-sft"


def load_spec(path: Path) -> Any:
    """The example env's spec."""
    from rollout.shared.envs.loader import load_environments

    [env] = load_environments(path)
    return env.to_spec()


async def rollouts(
    spec: Any,
    backend: Any,
    indices: list[int],
    *,
    n: int,
    temperature: float,
    seed: int,
    recipe: Any,
) -> list[dict[str, Any]]:
    """`n` episodes of each task (one batch), scored: the buffer's row shape."""
    from rollout.shared.agent.loop import Episode, SamplingParams, run_episodes
    from rollout.shared.contracts.budgets import resolve_budgets
    from rollout.shared.envs.engine import score, start_runtimes

    items = [(i, k) for i in indices for k in range(n)]
    runtimes = await start_runtimes(spec, [i for i, _ in items])  # as the actor starts them
    try:
        episodes = [
            Episode(
                rt,
                spec.tasks[i].instruction,
                sampling=SamplingParams(
                    temperature=temperature, max_tokens=recipe.max_tokens, seed=seed * 100_003 + j
                ),
            )
            for j, (rt, (i, _)) in enumerate(zip(runtimes, items, strict=True))
        ]
        trajectories = await run_episodes(
            episodes,
            backend,
            max_tool_calls=recipe.max_tool_calls,
            budgets=resolve_budgets(spec.budgets, None),
        )
        tools = [s.to_openai() for s in runtimes[0].tool_specs()] if runtimes else []
    finally:
        for rt in runtimes:
            await rt.close()
    out = []
    for (i, k), trajectory in zip(items, trajectories, strict=True):
        verdict = await score(spec, i, trajectory)
        out.append(
            {
                "task_index": i,
                "sample_index": k,
                "trajectory": trajectory.model_dump(mode="json"),
                "tools": tools,
                "score": None if trajectory.error else float(verdict.score),
                "passed": bool(verdict.passed) and not trajectory.error,
                "error": trajectory.error,
                "routed": trajectory.final_state.get("routed"),
            }
        )
    return out


def groups_of(rows: list[dict[str, Any]], version: int) -> list[dict[str, Any]]:
    """GRPO groups per task, built by the buffer's own builder (what the learner gets)."""
    from rollout.shared.contracts.buffer import GrpoGroupsQuery
    from rollout.shared.learning.datasets import grpo_groups

    query = GrpoGroupsQuery(
        run_ids=[RUN_ID], current_policy_version=version, max_staleness=0, min_group_size=2
    )
    items, _, _ = grpo_groups(
        ({**r, "run_id": RUN_ID, "rollout_id": f"{r['task_index']}-{r['sample_index']}",
          "policy_version": version} for r in rows),
        query,
    )  # fmt: skip
    return items


def sft_model(base: Path, env_file: Path, work: Path, tasks: int, settings: dict[str, Any]) -> Path:
    """The demo's SFT stage (cached): LoRA on the first `tasks` scripted train demonstrations."""
    from rollout.shared.learning import TrainConfig, train_sft
    from rollout.shared.learning.data import sft_examples
    from rollout.shared.learning.scripted import scripted_rollouts
    from rollout.shared.models.local_models import train_defaults
    from rollout.shared.models.smollm2 import NAME

    # A changed train split, base model or setting trains again.
    stamp = [tasks, settings, env_file.read_text(), str(base)]
    key = hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()
    out = work / f"sft-{key[:12]}"
    if (out / "adapter_config.json").is_file():
        return out
    demos, _ = asyncio.run(scripted_rollouts([env_file], split="train", per_env=tasks))
    config = TrainConfig(method="sft", **{**train_defaults(NAME), **settings})
    result = train_sft(base, sft_examples(demos), out / "job", config, resume=False)
    done = Path(result.model_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in done.iterdir():
        if f.is_file():
            (out / f.name).write_bytes(f.read_bytes())
    return out


def evaluate(spec: Any, model_dir: Path, test: list[int], recipe: Any) -> list[dict[str, Any]]:
    """Greedy test rollouts of the model saved at `model_dir`."""
    from rollout.shared.models.hf import HFBackend

    backend = HFBackend(model_dir, device="cpu", threads=2, stop_after_tool_call=True)
    return asyncio.run(rollouts(spec, backend, test, n=1, temperature=0.0, seed=0, recipe=recipe))


def passes(rows: list[dict[str, Any]]) -> list[bool]:
    """Pass/fail per task, in task order (an errored rollout is a fail, and is counted)."""
    return [r["passed"] for r in sorted(rows, key=lambda r: r["task_index"])]


def teams(rows: list[dict[str, Any]]) -> str:
    """The team each test task was routed to (first letter; '-' none), in task order."""
    out = []
    for r in sorted(rows, key=lambda r: r["task_index"]):
        routed = r["routed"] or []
        team = routed[0].get("team") if routed and isinstance(routed[0], dict) else None
        out.append(str(team)[0] if team else "-")
    return "".join(out)


def grpo_path(
    spec: Any,
    sft_dir: Path,
    work: Path,
    seed: int,
    args: argparse.Namespace,
    train: list[int],
    recipe: Any,
    variant: dict[str, Any] | None = None,
    name: str = "grpo",
) -> tuple[Path, list[dict[str, Any]], int]:
    """GRPO from the SFT adapter for `args.steps` steps: the final policy, a log, the steps taken
    (fewer when rounds kept giving no reward differences). `variant`: GRPO-family settings
    (loss_type, is_correction, ...) on top of the recipe's."""
    from rollout.shared.learning import GRPOLearner, TrainConfig
    from rollout.shared.models.hf import HFBackend

    config = TrainConfig(
        method="grpo", lora=True, lora_r=16, lora_alpha=32, learning_rate=args.lr,
        batch_size=4, max_seq_len=recipe.grpo["max_seq_len"], threads=2, beta=args.beta, max_staleness=0,
        group_size=args.group_size, tasks_per_step=args.tasks_per_step, seed=seed,
        temperature=args.temperature, max_steps=args.steps, **(variant or {}),
    )  # fmt: skip
    learner = GRPOLearner(sft_dir, work / f"{name}-{seed}", config, resume=False)
    backend = HFBackend(sft_dir, device="cpu", threads=2, stop_after_tool_call=True)
    rng = random.Random(seed)
    log = []
    attempts = 0
    while learner.policy_version < args.steps and attempts < args.steps * 3:
        attempts += 1
        tasks = sorted(rng.sample(train, min(args.tasks_per_step, len(train))))
        t0 = time.monotonic()
        rows = asyncio.run(
            rollouts(spec, backend, tasks, n=args.group_size, temperature=args.temperature,
                     seed=seed * 1000 + attempts, recipe=recipe)
        )  # fmt: skip
        sampled = time.monotonic() - t0
        before = learner.policy_version
        progress = learner.step(groups_of(rows, learner.policy_version))
        stepped = time.monotonic() - t0 - sampled
        reward = sum(r["score"] or 0 for r in rows) / len(rows)
        log.append({"version": learner.policy_version, "reward": round(reward, 3),
                    "pass": sum(r["passed"] for r in rows) / len(rows),
                    "sample_s": round(sampled, 1), "step_s": round(stepped, 1),
                    "kl": progress.kl, "tokens_per_s": progress.tokens_per_s,
                    "mismatch_kl": learner.metrics.get("last_mismatch_kl"),
                    "clip_fraction": learner.metrics.get("last_clip_fraction")})  # fmt: skip
        print(f"    seed {seed} v{learner.policy_version}: reward {reward:.3f} "
              f"pass {log[-1]['pass']:.2f} sample {sampled:.0f}s step {stepped:.0f}s",
              file=sys.stderr, flush=True)  # fmt: skip
        if learner.policy_version != before:
            backend.reload(learner.save())
    return learner.save(), log, learner.policy_version


def main() -> None:
    """Run the stages and print the comparison."""
    from rollout.cli.demo import BASE_MODEL, recipe_for
    from rollout.shared.models.smollm2 import ensure_smollm2
    from rollout.shared.stats import format_interval, paired_difference_interval, wilson_interval

    # Defaults: the demo's own recipe for the model (what `rollout demo` runs).
    recipe = recipe_for(BASE_MODEL)
    grpo, sft = recipe.grpo, recipe.sft
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=recipe.steps)
    p.add_argument("--tasks-per-step", type=int, default=grpo["tasks_per_step"])
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=grpo["learning_rate"])
    p.add_argument("--beta", type=float, default=grpo["beta"])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--sft-tasks", type=int, default=recipe.sft_max)
    p.add_argument("--sft-epochs", type=float, default=sft["epochs"])
    p.add_argument("--sft-lr", type=float, default=sft["learning_rate"])
    p.add_argument("--work", type=Path, default=Path("/tmp/grpo-over-sft"))
    p.add_argument("--env", type=Path, default=ENV_FILE, help="example env file")
    p.add_argument(
        "--split",
        help="split the stages are measured on (default: validation where the env has one, "
        "else test; recipes are chosen on validation, test is only reported)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    base = ensure_smollm2()
    spec = load_spec(args.env)
    splits = {t.split for t in spec.tasks}
    split = args.split or ("validation" if "validation" in splits else "test")
    train = [i for i, t in enumerate(spec.tasks) if t.split == "train"]
    test = [i for i, t in enumerate(spec.tasks) if t.split == split]
    print(f"{spec.slug}: {len(train)} train tasks, measured on {len(test)} {split} tasks",
          flush=True)  # fmt: skip
    t0 = time.monotonic()
    sft_settings = {**sft, "epochs": args.sft_epochs, "learning_rate": args.sft_lr}
    sft_dir = sft_model(base, args.env, args.work, args.sft_tasks, sft_settings)
    sft_rows = evaluate(spec, sft_dir, test, recipe)
    sft_pass = passes(sft_rows)
    n = len(sft_pass)
    k = sum(sft_pass)
    print(f"SFT: {k}/{n} {format_interval(wilson_interval(k, n))} teams {teams(sft_rows)} "
          f"({time.monotonic() - t0:.0f}s)", flush=True)  # fmt: skip
    results = []
    for seed in args.seeds:
        t1 = time.monotonic()
        final_dir, log, steps = grpo_path(spec, sft_dir, args.work, seed, args, train, recipe)
        if steps < args.steps:
            print(f"seed {seed}: only {steps} of {args.steps} steps (rounds without reward "
                  "differences)", flush=True)  # fmt: skip
        rows = evaluate(spec, final_dir, test, recipe)
        after = passes(rows)
        diff = paired_difference_interval(sft_pass, after)
        results.append({"seed": seed, "steps": steps, "passed": sum(after), "n": n,
                        "teams": teams(rows),
                        "difference": diff, "log": log,
                        "seconds": round(time.monotonic() - t1, 1)})  # fmt: skip
        print(f"seed {seed}: {sum(after)}/{n} {format_interval(wilson_interval(sum(after), n))} "
              f"teams {teams(rows)}  SFT->GRPO {diff[0]:+.0%} paired 95% "
              f"[{diff[1]:+.0%}, {diff[2]:+.0%}]  ({results[-1]['seconds']:.0f}s)", flush=True)  # fmt: skip
    helped = sum(r["passed"] > k for r in results)
    hurt = sum(r["passed"] < k for r in results)
    print(
        f"GRPO over SFT ({k}/{n}): helped {helped}, hurt {hurt}, same "
        f"{len(results) - helped - hurt} of {len(results)} seeds; "
        f"measurable (paired interval above 0) in {sum(r['difference'][1] > 0 for r in results)}"
    )
    if args.json:
        print(json.dumps({"sft": {"passed": k, "n": n}, "args": vars(args) | {"work": str(args.work)},
                          "results": results}, default=str))  # fmt: skip


if __name__ == "__main__":
    main()
