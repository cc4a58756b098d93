"""Learner overhead and online-GRPO pipelining, on the tiny model (CPU, one thread per role).

1. SFT: training tokens/s of `train_sft` (progress hooks, step log, checkpoints, final save)
   against calling TRL's SFTTrainer directly on the same data with the same arguments.
2. GRPO: share of the learner's wall time spent waiting for rollouts when actors must be on
   the current policy (max staleness 0: synchronous) against up to 2 versions behind
   (asynchronous). An actor thread samples groups with the hf backend and reloads each new
   policy the learner saves; the learner steps as soon as it has enough acceptable groups.
3. PPO: the learner's tokens/s (value head, GAE, `ppo_epochs` passes) against the GRPO
   learner's on the same groups in the same process (TRL 1.16 has no PPO trainer to call
   directly), and its wait share synchronous (max staleness 0) vs asynchronous (2), as in 2.
4. KTO and RM: `train_kto` / `train_rm` (hooks, step log, checkpoints, final save) against
   TRL's KTOTrainer / RewardTrainer called directly on the same rows with the same arguments.
   Both sides train the same examples for the same steps, so the ratio of examples/s is the
   ratio of tokens/s.

Run: `python benchmarks/learner.py [--sft-steps N] [--grpo-steps N] [--ppo-steps N]
[--pref-steps N] [--json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rollout.shared.learning import GRPOLearner, PPOLearner, TrainConfig, sft_examples, train_sft
from rollout.shared.learning.loading import load_base, quiet_libraries, torch_threads
from rollout.shared.learning.sft import sft_trainer
from rollout.shared.learning.trl_job import trl_kwargs
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.hf import HFBackend
from rollout.shared.models.tiny import build_tiny_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order",
            "description": "Read an order by id.",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        },
    }
]


def conversation(order: int) -> list[dict[str, Any]]:
    """A short tool-using support conversation (look an order up, answer)."""
    oid = f"O-{order}"
    call = {
        "id": "c0",
        "type": "function",
        "function": {"name": "get_order", "arguments": json.dumps({"id": oid})},
    }
    return [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": f"What is the amount of order {oid}?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": "c0",
            "name": "get_order",
            "content": json.dumps({"id": oid, "amount": 20 * order + 5}),
        },
        {"role": "assistant", "content": f"Order {oid} is ${20 * order + 5}."},
    ]


def rollouts(n: int) -> list[dict[str, Any]]:
    """Rollouts as the platform stores them."""
    return [{"trajectory": {"messages": conversation(i)}, "tools": TOOLS} for i in range(1, n + 1)]


def bench_sft(base: Path, work: Path, steps: int, repeats: int = 3) -> dict[str, float]:
    """Tokens/s through train_sft vs TRL's SFTTrainer called directly (same data and args)."""
    examples = sft_examples(rollouts(8))
    config = TrainConfig(
        method="sft", max_steps=steps, batch_size=4, learning_rate=1e-3, save_every=10, threads=1
    )
    # Warm-up: imports, kernels, datasets caches, for both sides alike.
    train_sft(base, examples, work / "warm", config.model_copy(update={"max_steps": 2}))

    ours_walls, ours_loops, direct_walls, direct_loops = [], [], [], []
    tokens = 0.0
    for rep in range(repeats):  # interleaved, so load on a shared box hits both alike
        started = time.perf_counter()
        ours = train_sft(base, examples, work / f"ours-{rep}", config, resume=False)
        ours_walls.append(time.perf_counter() - started)
        ours_loops.append(ours.metrics["train_runtime"])
        tokens = ours.metrics["num_input_tokens_seen"]
        wall, loop = _direct_sft(base, examples, work / f"direct-{rep}", config)
        direct_walls.append(wall)
        direct_loops.append(loop)
    ours_wall, direct_wall = statistics.median(ours_walls), statistics.median(direct_walls)
    ours_loop, direct_loop = statistics.median(ours_loops), statistics.median(direct_loops)
    return {
        "steps": steps,
        "tokens": tokens,
        "ours_tokens_per_s": tokens / ours_wall,
        "direct_tokens_per_s": tokens / direct_wall,
        "ours_train_loop_tokens_per_s": tokens / ours_loop,
        "direct_train_loop_tokens_per_s": tokens / direct_loop,
        "repeats": repeats,
        "overhead_ratio": ours_wall / direct_wall,
    }


def _direct_sft(
    base: Path, examples: list[dict[str, Any]], out: Path, config: TrainConfig
) -> tuple[float, float]:
    """TRL's SFTTrainer on the same data and arguments: (wall incl. load+save, loop time)."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    quiet_libraries()
    started = time.perf_counter()
    tokenizer, model = load_base(base)
    with torch_threads(1, model):
        trainer = sft_trainer(
            model, tokenizer, Dataset.from_list(examples), trl_kwargs(out, config), [], None
        )
        trainer.remove_callback(PrinterCallback)  # printing logs is not training
        output = trainer.train()
        trainer.save_model(str(out / "model"))
    return time.perf_counter() - started, output.metrics["train_runtime"]


def _bad_reply(order: int) -> list[dict[str, Any]]:
    return conversation(order)[:2] + [{"role": "assistant", "content": "I cannot look that up."}]


def _preference_rows(method: str) -> list[dict[str, Any]]:
    """KTO's labelled completions or the RM's chosen/rejected pairs, validated as ours are."""
    from rollout.shared.learning import kto
    from rollout.shared.learning.data import preference_rows

    tools = json.dumps(TOOLS)
    if method == "kto":
        rows = []
        for order in range(1, 9):
            good = conversation(order)
            rows.append({"prompt": good[:2], "completion": good[2:], "label": True, "tools": tools})
            rows.append(
                {"prompt": good[:2], "completion": _bad_reply(order)[2:], "label": False,
                 "tools": tools}
            )  # fmt: skip
        return kto._validated(rows)
    pairs = [
        {"prompt": conversation(o)[:2], "chosen": conversation(o)[2:],
         "rejected": _bad_reply(o)[2:], "tools": tools}
        for o in range(1, 9)
    ]  # fmt: skip
    return preference_rows(pairs, "rm")


def bench_preference(
    base: Path, work: Path, method: str, steps: int, repeats: int = 3
) -> dict[str, float]:
    """Examples/s of train_kto / train_rm against TRL's trainer called directly, interleaved."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from rollout.shared.learning import train_kto, train_rm
    from rollout.shared.learning.kto import kto_trainer
    from rollout.shared.learning.rm import load_classifier, rm_trainer

    rows = _preference_rows(method)
    config = TrainConfig(
        method=method, max_steps=steps, batch_size=4, learning_rate=1e-3, save_every=10, threads=1
    )
    ours_fn = train_kto if method == "kto" else train_rm
    make = kto_trainer if method == "kto" else rm_trainer

    def direct(out: Path) -> float:
        quiet_libraries()
        started = time.perf_counter()
        if method == "kto":
            tokenizer, model = load_base(base)
        else:
            tokenizer, model, _ = load_classifier(base, False)
        with torch_threads(1, model):
            trainer = make(
                model, tokenizer, Dataset.from_list(rows), trl_kwargs(out, config), [], None,
                config=config,
            )  # fmt: skip
            trainer.remove_callback(PrinterCallback)
            trainer.train()
            trainer.save_model(str(out / "model"))
        return time.perf_counter() - started

    ours_fn(base, rows, work / f"{method}-warm", config.model_copy(update={"max_steps": 2}))
    ours_walls, direct_walls = [], []
    for rep in range(repeats):
        started = time.perf_counter()
        ours_fn(base, rows, work / f"{method}-ours-{rep}", config, resume=False)
        ours_walls.append(time.perf_counter() - started)
        direct_walls.append(direct(work / f"{method}-direct-{rep}"))
    examples = steps * config.batch_size
    ours_wall, direct_wall = statistics.median(ours_walls), statistics.median(direct_walls)
    return {
        "method": method,
        "steps": steps,
        "ours_examples_per_s": examples / ours_wall,
        "direct_examples_per_s": examples / direct_wall,
        "ratio": direct_wall / ours_wall,
        "repeats": repeats,
    }


class Actor(threading.Thread):
    """Samples groups with the current policy forever; reloads when a new one is published."""

    def __init__(self, base: Path, groups: queue.Queue, prompts: int, group: int) -> None:
        super().__init__(daemon=True)
        self.backend = HFBackend(base)
        self.out = groups
        self.prompts = [
            [{"role": "user", "content": f"Say something {i}."}] for i in range(prompts)
        ]
        self.group = group
        self.version = 0
        self.seed = 0
        self.published: tuple[int, Path] | None = None
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def publish(self, version: int, path: Path) -> None:
        """The learner announces a new policy (what `policy.updated` does in the platform)."""
        with self.lock:
            self.published = (version, path)

    def run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                new, self.published = self.published, None
            if new is not None:
                self.version, path = new
                self.backend.reload(path)
            self.run_once()

    def run_once(self) -> None:
        """Sample one group per prompt with the loaded policy."""
        vocab = len(self.backend.tokenizer)
        version = self.version
        for prompt in self.prompts:
            requests = [
                ChatRequest(messages=prompt, max_tokens=24, seed=self.seed + j)
                for j in range(self.group)
            ]
            self.seed += self.group
            replies = asyncio.run(self.backend.generate(requests))
            self.out.put(
                {
                    "prompt": prompt,
                    "tools": None,
                    "completions": [
                        {
                            "token_ids": [r.token_ids],
                            "logprobs": [r.logprobs],
                            "messages": prompt + [r.assistant_message()],
                            "reward": sum(t < vocab // 2 for t in r.token_ids)
                            / max(1, len(r.token_ids)),
                            "policy_version": version,
                        }
                        for r in replies
                    ],
                }
            )


def _online_learner(base: Path, out: Path, method: str, staleness: int) -> GRPOLearner:
    """A GRPO or PPO learner with the benchmark's settings (no KL, one thread)."""
    if method == "ppo":
        config = TrainConfig(
            method="ppo", learning_rate=1e-2, kl_coef=0.0, max_staleness=staleness, threads=1
        )
        return PPOLearner(base, out, config, resume=False)
    config = TrainConfig(
        method="grpo", learning_rate=1e-2, beta=0.0, max_staleness=staleness, threads=1
    )
    return GRPOLearner(base, out, config, resume=False)


def bench_grpo(
    base: Path, work: Path, steps: int, staleness: int, method: str = "grpo"
) -> dict[str, float]:
    """Run `steps` learner steps fed by one actor thread; report the learner's wait share."""
    import torch

    torch.set_num_threads(1)
    groups_per_step = 4
    learner = _online_learner(base, work / f"{method}-{staleness}", method, staleness)
    inbox: queue.Queue = queue.Queue()
    actor = Actor(base, inbox, prompts=groups_per_step, group=4)
    actor.start()
    waited = 0.0
    started = time.perf_counter()
    for _ in range(steps):
        batch: list[dict[str, Any]] = []
        while len(batch) < groups_per_step:
            t = time.perf_counter()
            group = inbox.get()
            waited += time.perf_counter() - t
            if learner.accepts(group["completions"][0]["policy_version"]):
                batch.append(group)
            else:
                learner.metrics["dropped_stale"] += len(group["completions"])
        learner.step(batch)
        actor.publish(learner.policy_version, learner.save())
    wall = time.perf_counter() - started
    actor.stop.set()
    actor.join(timeout=120)
    return {
        "method": method,
        "max_staleness": staleness,
        "steps": steps,
        "wall_s": wall,
        "wait_s": waited,
        "wait_share": waited / wall,
        "steps_per_min": 60 * steps / wall,
        "dropped_stale_completions": learner.metrics["dropped_stale"],
    }


def bench_ppo_tokens(base: Path, work: Path, steps: int) -> dict[str, float]:
    """Learner tokens/s of PPO vs GRPO stepping on the same sampled groups, interleaved."""
    import torch

    torch.set_num_threads(1)
    actor = Actor(base, queue.Queue(), prompts=4, group=4)
    batches = []
    for _ in range(steps + 1):  # one warm-up batch
        actor.run_once()
        batches.append([actor.out.get() for _ in range(4)])
    learners = {m: _online_learner(base, work / f"tok-{m}", m, 64) for m in ("grpo", "ppo")}
    seconds = {m: 0.0 for m in learners}
    tokens = 0.0
    for i, batch in enumerate(batches):
        for method, learner in learners.items():
            started = time.perf_counter()
            learner.step(batch)
            if i:  # the first step warms kernels and the optimizer state up
                seconds[method] += time.perf_counter() - started
        if i:
            tokens += sum(len(t) for g in batch for c in g["completions"] for t in c["token_ids"])
    ppo, grpo = tokens / seconds["ppo"], tokens / seconds["grpo"]
    return {
        "steps": steps,
        "completion_tokens": tokens,
        "ppo_epochs": float(learners["ppo"].config.ppo_epochs),
        "ppo_tokens_per_s": ppo,
        "grpo_tokens_per_s": grpo,
        "ppo_vs_grpo": ppo / grpo,
    }


def _print_pref(rows: list[dict[str, float]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(
            f"{str(row['method']).upper()} ({row['steps']} steps, median of {row['repeats']}): "
            f"ours {row['ours_examples_per_s']:.1f} examples/s vs TRL directly "
            f"{row['direct_examples_per_s']:.1f} (x{row['ratio']:.2f})"
        )


def main() -> None:
    """Run both benchmarks and print a table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--grpo-steps", type=int, default=12)
    parser.add_argument("--ppo-steps", type=int, default=8)
    parser.add_argument("--pref-steps", type=int, default=20, help="KTO and RM steps")
    parser.add_argument("--only", choices=["all", "pref"], default="all")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rollout-bench-learner-") as tmp:
        work = Path(tmp)
        base = build_tiny_model(work / "base", seed=0, corpus=[json.dumps(r) for r in rollouts(8)])
        pref = [bench_preference(base, work, m, args.pref_steps) for m in ("kto", "rm")]
        if args.only == "pref":
            _print_pref(pref, args.json)
            return
        sft = bench_sft(base, work, args.sft_steps)
        grpo = [bench_grpo(base, work, args.grpo_steps, s) for s in (0, 2)]
        ppo_tokens = bench_ppo_tokens(base, work, args.ppo_steps)
        ppo = [bench_grpo(base, work, args.ppo_steps, s, method="ppo") for s in (0, 2)]
    if args.json:
        print(
            json.dumps(
                {"sft": sft, "grpo": grpo, "ppo": ppo, "ppo_tokens": ppo_tokens, "pref": pref},
                indent=2,
            )
        )
        return
    _print_pref(pref, False)
    print(
        f"SFT ({sft['steps']} steps, {sft['tokens']:.0f} tokens): train_sft "
        f"{sft['ours_tokens_per_s']:.0f} tok/s end to end vs TRL SFTTrainer directly "
        f"{sft['direct_tokens_per_s']:.0f} tok/s (overhead x{sft['overhead_ratio']:.2f}); "
        f"train loops {sft['ours_train_loop_tokens_per_s']:.0f} vs "
        f"{sft['direct_train_loop_tokens_per_s']:.0f} tok/s"
    )
    for row in grpo:
        print(
            f"GRPO max_staleness={row['max_staleness']}: learner waited "
            f"{100 * row['wait_share']:.0f}% of {row['wall_s']:.1f}s, "
            f"{row['steps_per_min']:.1f} steps/min, "
            f"{row['dropped_stale_completions']:.0f} stale completions dropped"
        )
    print(
        f"PPO learner ({ppo_tokens['steps']} steps, ppo_epochs {ppo_tokens['ppo_epochs']:.0f}): "
        f"{ppo_tokens['ppo_tokens_per_s']:.0f} completion tok/s vs the GRPO learner's "
        f"{ppo_tokens['grpo_tokens_per_s']:.0f} on the same groups "
        f"(x{ppo_tokens['ppo_vs_grpo']:.2f})"
    )
    for row in ppo:
        print(
            f"PPO max_staleness={row['max_staleness']}: learner waited "
            f"{100 * row['wait_share']:.0f}% of {row['wall_s']:.1f}s, "
            f"{row['steps_per_min']:.1f} steps/min, "
            f"{row['dropped_stale_completions']:.0f} stale completions dropped"
        )


if __name__ == "__main__":
    main()
