"""Can a policy see what its answer did? (issue 22) A linear probe of the outcome clip's visual tokens.

A second look on push shows the policy the clip of its failed strike: the puck stops short of the green
zone, or slides past it. To correct its second answer the policy must read which. This probe separates
perception from learning for that read: it renders outcome clips of lettered answers (`env.answer=grid`)
exactly as a multi-turn episode does (`rl.episodes.outcome_clip`), labels each by what the simulator says
(short / success / overshoot, `envs.reward.env_reward`) and fits a linear probe
(`eval.probe.linear_probe`) on each policy's frozen visual tokens of the clip: fitted on training episodes,
scored on held-out ones, against the majority class. `--clip frozen` probes the control clip
(`env.turn_clip=frozen`), which holds no outcome: the probe must fall to the majority class there.

    PYTHONPATH=. python docs/results/scripts/outcome_probe.py --root data/generated/push2k --test-root DATA \\
        --fit 600 \\
        --held 300 --out probe.json start=runs/.../seed0/start/model

Each episode gets `--answers` letters drawn without replacement (seeded by its index).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from embodied.config import PolicyConfig
from embodied.data.load import Example, load_examples
from embodied.envs import answer_examples
from embodied.envs.reward import env_reward
from embodied.eval.probe import linear_probe, padded_features, pooled
from embodied.policy.model import load
from embodied.questions import LETTERS
from embodied.rl.episodes import outcome_clip
from embodied.video import VideoConfig

OUTCOMES = ("short", "overshoot")


def label(terms: dict) -> str:
    if terms["reward/success"] > 0:
        return "success"
    missed = [t for t in OUTCOMES if terms.get(f"reward/{t}", 0) < 0]
    return missed[0] if missed else "other"


def outcome_examples(examples, answers: int, video: VideoConfig, turn_clip: str, seed: int, desc: str):
    """`answers` outcome clips per episode as `Example`s, with their labels."""
    out, labels = [], []
    for i, ex in enumerate(tqdm(examples, desc=desc, unit="episode")):
        n = len(ex.record["options"])
        picks = np.random.default_rng([seed, i]).choice(n, size=min(answers, n), replace=False)
        texts = [f"<think></think><answer>{LETTERS[p]}</answer>" for p in picks]
        for text, terms in zip(texts, env_reward(texts, [ex.record] * len(texts))):
            clip = outcome_clip(ex.record, text, video, ex.clip, turn_clip)
            out.append(Example(ex.record, clip))
            labels.append(label(terms))
    return out, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("policies", nargs="+", help="name=model_dir")
    ap.add_argument("--root", required=True, help="episodes whose train split the probe is fitted on")
    ap.add_argument("--test-root", help="episodes whose test split it is scored on (default: --root)")
    ap.add_argument("--fit", type=int, default=600)
    ap.add_argument("--held", type=int, default=300)
    ap.add_argument("--answers", type=int, default=2)
    ap.add_argument("--clip", default="outcome", choices=("outcome", "frozen"))
    ap.add_argument("--fps", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(1)
    video = VideoConfig(fps=a.fps)

    def episodes(root: str, split: str, n: int):
        exs = answer_examples(load_examples(root, split, a.fps, video.max_frames)[0], "grid")
        return [e for e in exs if e.record["task"] == "push"][:n]

    fit, fit_y = outcome_examples(episodes(a.root, "train", a.fit), a.answers, video, a.clip, a.seed, "fit")
    held_eps = episodes(a.test_root or a.root, "test", a.held)
    held, held_y = outcome_examples(held_eps, a.answers, video, a.clip, a.seed + 1, "held")
    result = {
        "clip": a.clip,
        "labels_fit": {k: fit_y.count(k) for k in sorted(set(fit_y))},
        "labels_held": {k: held_y.count(k) for k in sorted(set(held_y))},
        "policies": {},
    }
    for spec in a.policies:
        name, path = spec.split("=", 1)
        model, processor = load(PolicyConfig(path=path))
        model.eval()
        with torch.no_grad():
            x_fit, x_held = padded_features(model, processor, fit, held, video)
        dim = model.config.vision_config.out_hidden_size
        views = {"tokens": (x_fit, x_held), "pooled": (pooled(x_fit, dim), pooled(x_held, dim))}
        row = {}
        for view, (xf, xh) in views.items():
            row[view] = {"three_way": linear_probe(xf, fit_y, xh, held_y)}
            keep_f = [i for i, y in enumerate(fit_y) if y in OUTCOMES]
            keep_h = [i for i, y in enumerate(held_y) if y in OUTCOMES]
            row[view]["short_vs_overshoot"] = linear_probe(
                xf[keep_f], [fit_y[i] for i in keep_f], xh[keep_h], [held_y[i] for i in keep_h]
            )
        result["policies"][name] = {"path": path} | row
        print(name, json.dumps(row))
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
