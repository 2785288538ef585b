"""Can the policy learn to use a second look when it is told how? A labelled ceiling (issue 22).

Multi-turn training (GRPO, expert iteration) did not teach the tiny policy to read the outcome of its
failed strike on push, though a linear probe reads short / overshoot from the outcome clip's tokens
(`docs/results/scripts/outcome_probe.py`). This separates what the language model can learn from what those
recipes give it. From a policy, it plays every training episode greedily for two turns
(`rl.episodes.play`) and fine-tunes on:

- each failed first answer's turn-2 conversation (the clip, the answer, the clip of its outcome), with the
  one-step correction as target: the next lettered option in the direction the failure asks (the task's
  `CORRECTIONS`: a larger impulse after a short strike, a smaller one after an overshoot). This target is
  a human rule, not a simulator-verified answer: the run measures a ceiling, it is not a recipe;
- each first answer that succeeded, as itself (so turn 1 is kept).

    PYTHONPATH=. python docs/results/scripts/second_look_ceiling.py MODEL OUT --root EPISODES [--n 1000] \\
        [key=value ...]

Writes `OUT/model`, `OUT/metrics.jsonl` and `OUT/targets.json`; evaluate it with
`docs/results/scripts/env_multiturn.py --stages start` like any other policy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from embodied.config import load_config
from embodied.data.load import Example, load_examples
from embodied.envs import answer_examples, task
from embodied.envs.config import Turns
from embodied.envs.core import parse_letter
from embodied.experiments.config import EnvFeedbackRun
from embodied.policy.model import load_policy, save_policy
from embodied.questions import LETTERS
from embodied.rl.episodes import again, play
from embodied.rl.rewards import rewards_for
from embodied.rl.rollout import Sampling
from embodied.train.common import seed_everything
from embodied.train.expert import round_sft
from embodied.train.sft import train_sft
from embodied.train.state import Run


def correction(record: dict, text: str, terms: dict) -> str | None:
    """The one-step corrected answer to a failed lettered `text`, or None when no option lies that way."""
    grid = record["meta"]["answer_grid"]
    index = parse_letter(text, len(grid))
    for term, (coord, sign) in task(record["task"]).CORRECTIONS.items():
        if terms.get(term, 0.0) < 0:
            values = [np.atleast_1d(g)[coord] for g in grid]
            # options ordered by the corrected coordinate; the next one past the failed answer's value
            ahead = sorted(
                (i for i, v in enumerate(values) if np.sign(v - values[index]) == sign),
                key=lambda i: abs(values[i] - values[index]),
            )
            return f"<think></think><answer>{LETTERS[ahead[0]]}</answer>" if ahead else None
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("out", type=Path)
    ap.add_argument("--root", required=True, help="training episodes (env.root)")
    ap.add_argument("--n", type=int, default=1000, help="training episodes played")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("overrides", nargs="*")
    a, rest = ap.parse_known_args()
    overrides = ["env.answer=grid", "env.turns=2", *a.overrides, *rest]
    cfg = load_config("configs/experiment_env_feedback.yaml", overrides, schema=EnvFeedbackRun)
    torch.set_num_threads(cfg.threads)
    seed_everything(a.seed)
    examples = answer_examples(load_examples(a.root, "train", cfg.video.fps, cfg.video.max_frames)[0], "grid")
    examples = [e for e in examples if e.record["task"] == "push"][: a.n]
    model, processor = load_policy(a.model, cfg.policy.dtype, cfg.policy.device)
    model.eval()
    kept, targets, counts = [], {}, {"first_success": 0, "corrected": 0, "no_option_that_way": 0}
    reward_fn = rewards_for(cfg)
    for start in range(0, len(examples), cfg.eval.batch_size):
        chunk = examples[start : start + cfg.eval.batch_size]
        ep = play(
            model, processor, chunk, cfg.video, reward_fn, Turns(2), Sampling(1, cfg.grpo.max_new_tokens)
        )
        for t, traj in enumerate(ep.per_trajectory()):
            ex, (text, terms) = chunk[t], traj[0]
            if terms["reward/success"] > 0:
                kept.append(ex)
                targets[ex.record["id"]] = text
                counts["first_success"] += 1
                continue
            if terms["reward/unparseable"] or len(ep.clips[t]) < 2:
                continue
            target = correction(ex.record, text, terms)
            if target is None:
                counts["no_option_that_way"] += 1
                continue
            record = ex.record | {"id": f"{ex.record['id']}/turn2"}
            kept.append(
                Example(record, ex.clip, ((text, again(terms, cfg.env.turn_words)),), (ep.clips[t][1],))
            )
            targets[record["id"]] = target
            counts["corrected"] += 1
        print(f"played {start + len(chunk)} / {len(examples)}: {counts}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "targets.json").write_text(json.dumps({"counts": counts, "targets": targets}, indent=1) + "\n")
    tune = round_sft(cfg.sft, a.steps, cfg.expert.batch_size, a.lr)
    run = Run(model, processor, kept, a.out, cfg.video, seed=a.seed)
    train_sft(tune, run, target_fn=lambda rec: targets[rec["id"]])
    save_policy(model, processor, a.out / "model")


if __name__ == "__main__":
    main()
