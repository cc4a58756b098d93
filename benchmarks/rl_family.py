"""The GRPO family on the real model: every `loss_type` x (`none`, `tis`) from one SFT'd start.

The same SFT'd SmolLM2-135M (the demo's SFT stage, cached), then per variant the same number of
GRPO steps with the same seeds, tasks and samples per step (benchmarks/grpo_over_sft.py's
in-process path: the learner service's own `GRPOLearner` and the hf backend), then greedy
evaluation on the env's validation split (where the default is chosen) and its test split
(only reported). Per variant it prints the pass rates with Wilson intervals, the paired
difference to plain GRPO (`loss_type = "grpo"`, `is_correction = "none"`) with its 95% interval
(same tasks, greedy: each task is a pair), the learner's tokens/s, and the mean mismatch KL and
clip fraction of its steps. A markdown table ends the output (docs/algorithms.md holds the one
measured). Numbers are measured; nothing is assumed.

Run: `python benchmarks/rl_family.py [--variants grpo/none dapo/tis ...] [--seed S] [--steps N]
[--json]` (defaults: all ten variants, the demo's GRPO settings for local/smollm2-135m).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_over_sft import (  # noqa: E402
    ENV_FILE,
    evaluate,
    grpo_path,
    load_spec,
    passes,
    sft_model,
)

LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "gspo", "cispo")
VARIANTS = tuple(f"{loss}/{corr}" for loss in LOSS_TYPES for corr in ("none", "tis"))
BASELINE = "grpo/none"


def settings_of(variant: str) -> dict[str, Any]:
    """`loss/correction` as GrpoConfig settings."""
    loss, correction = variant.split("/")
    return {"loss_type": loss, "is_correction": correction}


def mean(values: list[Any]) -> float | None:
    """The mean of the numbers in `values` (None when there are none)."""
    nums = [float(v) for v in values if isinstance(v, int | float)]
    return sum(nums) / len(nums) if nums else None


def main() -> None:
    """SFT once, every variant's GRPO from it, the table."""
    from rollout.cli.demo import BASE_MODEL, recipe_for
    from rollout.shared.models.smollm2 import ensure_smollm2
    from rollout.shared.stats import format_interval, paired_difference_interval, wilson_interval

    recipe = recipe_for(BASE_MODEL)
    grpo, sft = recipe.grpo, recipe.sft
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), help="loss/correction")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=recipe.steps)
    p.add_argument("--tasks-per-step", type=int, default=grpo["tasks_per_step"])
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=grpo["learning_rate"])
    p.add_argument("--beta", type=float, default=grpo["beta"])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--sft-tasks", type=int, default=recipe.sft_max)
    p.add_argument("--work", type=Path, default=Path("/tmp/rl-family"))
    p.add_argument("--env", type=Path, default=ENV_FILE, help="example env file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", type=Path, help="append one JSON line per finished variant here")
    args = p.parse_args()
    for v in args.variants:
        loss, _, corr = v.partition("/")
        if loss not in LOSS_TYPES or corr not in ("none", "tis", "mis"):
            p.error(f"--variants: {v!r} is not LOSS/CORRECTION ({', '.join(VARIANTS)})")
    if BASELINE not in args.variants:
        args.variants.insert(0, BASELINE)  # the paired differences are against it

    args.work.mkdir(parents=True, exist_ok=True)
    base = ensure_smollm2()
    spec = load_spec(args.env)
    train = [i for i, t in enumerate(spec.tasks) if t.split == "train"]
    splits = {
        s: [i for i, t in enumerate(spec.tasks) if t.split == s] for s in ("validation", "test")
    }
    if not splits["validation"]:
        sys.exit(f"{spec.slug} has no validation split to choose a default on")
    print(f"{spec.slug}: {len(train)} train, {len(splits['validation'])} validation, "
          f"{len(splits['test'])} test tasks", flush=True)  # fmt: skip
    sft_dir = sft_model(base, args.env, args.work, args.sft_tasks, dict(sft))
    results: dict[str, dict[str, Any]] = {}
    start = {s: passes(evaluate(spec, sft_dir, idx, recipe)) for s, idx in splits.items()}
    for s, got in start.items():
        print(f"SFT start, {s}: {sum(got)}/{len(got)} "
              f"{format_interval(wilson_interval(sum(got), len(got)))}", flush=True)  # fmt: skip
    for variant in args.variants:
        t0 = time.monotonic()
        name = variant.replace("/", "-")
        final, log, steps = grpo_path(
            spec, sft_dir, args.work, args.seed, args, train, recipe,
            variant=settings_of(variant), name=name,
        )  # fmt: skip
        after = {s: passes(evaluate(spec, final, idx, recipe)) for s, idx in splits.items()}
        results[variant] = {
            "steps": steps,
            "passes": after,
            "tokens_per_s": mean([e.get("tokens_per_s") for e in log]),
            "mismatch_kl": mean([e.get("mismatch_kl") for e in log]),
            "clip_fraction": mean([e.get("clip_fraction") for e in log]),
            "seconds": round(time.monotonic() - t0, 1),
        }
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps({"variant": variant, "log": log} | results[variant]) + "\n")
        line = ", ".join(f"{s} {sum(a)}/{len(a)}" for s, a in after.items())
        print(f"{variant}: {line} ({results[variant]['seconds']:.0f}s, {steps} steps)",
              flush=True)  # fmt: skip

    base_passes = results[BASELINE]["passes"]
    rows = []
    for variant, r in results.items():
        row: dict[str, Any] = {"variant": variant, "steps": r["steps"]}
        for s in splits:
            got = r["passes"][s]
            row[s] = (sum(got), len(got), wilson_interval(sum(got), len(got)))
            row[f"{s}_vs_grpo"] = paired_difference_interval(base_passes[s], got)
        row |= {k: r[k] for k in ("tokens_per_s", "mismatch_kl", "clip_fraction", "seconds")}
        rows.append(row)
    best = max(rows, key=lambda r: (r["validation"][0], r["variant"] == BASELINE))
    print()
    print("| variant | validation | vs grpo/none (paired 95%) | test | vs grpo/none (paired 95%) "
          "| tokens/s | mismatch KL | clip fraction |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r["variant"] + (" (best on validation)" if r is best else "")]
        for s in ("validation", "test"):
            k, n, ci = r[s]
            d = r[f"{s}_vs_grpo"]
            cells += [f"{k}/{n} {format_interval(ci)}",
                      "-" if r["variant"] == BASELINE else f"{d[0]:+.0%} [{d[1]:+.0%}, {d[2]:+.0%}]"]  # fmt: skip
        cells += [f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "-",
                  f"{r['mismatch_kl']:.2g}" if r["mismatch_kl"] is not None else "-",
                  f"{r['clip_fraction']:.3f}" if r["clip_fraction"] is not None else "-"]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    print(f"\nSFT start: validation {sum(start['validation'])}/{len(start['validation'])}, "
          f"test {sum(start['test'])}/{len(start['test'])}; seed {args.seed}, {args.steps} steps "
          f"x {args.tasks_per_step} tasks x {args.group_size} samples; picked on validation: "
          f"{best['variant']}")  # fmt: skip
    if args.json:
        print(json.dumps({"args": vars(args) | {"work": str(args.work)}, "rows": rows},
                         default=str))  # fmt: skip


if __name__ == "__main__":
    main()
