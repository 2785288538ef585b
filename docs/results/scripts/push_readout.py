"""Do a policy's frozen visual tokens hold what `push` needs? Linear probes, and a probe used as the policy.

`push` asks for the impulse J* = J_demo sqrt(D / d_demo): two distances read from the clip (the demo's slide
d_demo, the zone's distance D) and the stated demo impulse. When a policy fails on it even with labels
(`docs/results/scripts/env_labelled_ceiling.py`), this separates perception from readout
(docs/results/env_push.md, "Why `push` is not learned"):

* quartile probes (`embodied.eval.probe.linear_probe`) of d_demo, D and the ratio J* / J_demo on each
  policy's visual tokens of the whole clip, fitted on the first `--fit` training episodes and tested on the
  other training episodes and the held-out ones;
* the same ratio and grid probes on two other views of the tokens (`--views`): `pooled`, their mean and
  max over tokens (which token holds what is lost), and `unscaled`, every coordinate divided by one
  deviation instead of its own (the relative scales a language model receives);
* the grid probe: the `env.answer=grid` option nearest (in log) to the calibrated impulse, 8 classes, whose
  predicted letters are executed in MuJoCo on the same held-out episodes, beside the best constant letter
  and the nearest option itself, also on the held-out split alone (`test_split`, where labelled SFT is
  scored); `--fit-small` refits it on fewer episodes, e.g. the 200 that RL gets::

    PYTHONPATH=. python docs/results/scripts/push_readout.py --root data/generated/push2k --fit 1600 \\
        --fit-small 200 \\
        --out readout.json tiny-base=tiny-base start0=runs/env_feedback/seed0/start/model

The episodes come from `generate_episodes` with `'env.tasks=[push]'` and enough `env.n_train`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from embodied.config import PolicyConfig
from embodied.data.load import load_examples
from embodied.envs import answer_examples, push
from embodied.envs.reward import env_reward
from embodied.eval.probe import linear_probe, padded_features, pooled
from embodied.eval.stats import wilson_interval
from embodied.experiments.reuse import code_hash, weights_hash
from embodied.policy.model import load
from embodied.questions import LETTERS
from embodied.video import VideoConfig

QUANTITIES = ("demo distance", "zone distance", "ratio J*/J_demo")


def quantities(record: dict) -> dict[str, float]:
    """The two distances and their ratio J* / J_demo (the calibrated impulse simulated once per record)."""
    s = record["meta"]["scene"]
    return {
        "demo distance": (s["demo_impulse"] / push.MASS) ** 2 / (2 * s["friction"] * 9.81),
        "zone distance": s["target"],
        "ratio J*/J_demo": push.good_action(record) / s["demo_impulse"],
    }


def quartiles(q: str, q_fit: list[dict], q_held: list[dict]) -> tuple[list[str], list[str]]:
    """Quartile classes (`q0`..`q3`, edges from the fitted episodes) of quantity `q` on both sets."""
    edges = np.quantile([v[q] for v in q_fit], [0.25, 0.5, 0.75])
    return [f"q{int(np.searchsorted(edges, v[q]))}" for v in q_fit], [
        f"q{int(np.searchsorted(edges, v[q]))}" for v in q_held
    ]


def nearest_option(ratio: float) -> int:
    """The grid option (a multiple of the stated impulse) nearest in log to `ratio`."""
    return int(np.argmin(np.abs(np.log(np.array(push.GRID_RATIOS)) - np.log(ratio))))


def executed(records: list[dict], letters: list[str], n_test: int = 0) -> dict:
    """Success of `letters` executed in MuJoCo, with its interval; with `n_test`, also on the last `n_test`
    records alone (the held-out split, where labelled SFT is scored)."""
    terms = env_reward([f"<think></think><answer>{x}</answer>" for x in letters], records)
    wins = [t["reward/success"] for t in terms]

    def rate(w: list[float]) -> dict:
        return {"success": sum(w) / len(w), "ci95": list(wilson_interval(int(sum(w)), len(w)))}

    return rate(wins) | ({"test_split": rate(wins[-n_test:])} if n_test else {})


def grid_probe(x_fit, y_fit: list[int], x_held, y_held: list[int], held: list[dict], n_test: int) -> dict:
    out = linear_probe(x_fit, [str(y) for y in y_fit], x_held, [str(y) for y in y_held], predictions=True)
    pred = [int(p) for p in out.pop("predictions")]
    out["within_one_option"] = float(np.mean([abs(p - y) <= 1 for p, y in zip(pred, y_held)]))
    out["as_policy"] = executed(held, [LETTERS[p] for p in pred], n_test)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="push episodes (train and test splits)")
    p.add_argument("--fit", type=int, default=1600, help="training episodes the probes are fitted on")
    p.add_argument("--fit-small", type=int, default=0, help="also fit the grid probe on this many")
    p.add_argument(
        "--views",
        action="store_true",
        help="also probe the ratio and the grid on pooled tokens and on tokens scaled by one deviation",
    )
    p.add_argument("--out", required=True)
    p.add_argument("policies", nargs="+", help="NAME=PATH (a model folder, or tiny-base / tiny-worlds)")
    args = p.parse_args()
    torch.set_num_threads(1)
    video = VideoConfig()
    train, test = (
        answer_examples(load_examples(args.root, s, video.fps, video.max_frames)[0], "grid")
        for s in ("train", "test")
    )
    if any(e.record["task"] != "push" for e in train + test) or len(train) <= args.fit:
        raise SystemExit(f"{args.root}: needs push episodes only, more than --fit={args.fit} in train")
    fit, held = train[: args.fit], train[args.fit :] + test
    held_records = [e.record for e in held]
    q_fit = [quantities(e.record) for e in fit]
    q_held = [quantities(e.record) for e in held]
    quartile_labels = {q: quartiles(q, q_fit, q_held) for q in QUANTITIES}  # the same for every policy
    y_fit = [nearest_option(q["ratio J*/J_demo"]) for q in q_fit]
    y_held = [nearest_option(q["ratio J*/J_demo"]) for q in q_held]
    constants = [
        {"letter": x} | executed(held_records, [x] * len(held), len(test))
        for x in LETTERS[: len(push.GRID_RATIOS)]
    ]
    out = {
        "root": args.root,
        "n_fit": len(fit),
        "n_held": len(held),
        "constant_letter": max(constants, key=lambda c: c["success"]),
        "nearest_option": executed(held_records, [LETTERS[y] for y in y_held], len(test)),
        "code": code_hash(),
        "policies": {},
    }
    for spec in args.policies:
        name, path = spec.split("=", 1)
        model, processor = load(PolicyConfig(path=path))
        x_fit, x_held = padded_features(model, processor, fit, held, video)
        row: dict = {"path": path, "weights": weights_hash(path, 0)}
        for q, (y_q, y_q_held) in quartile_labels.items():
            row[q] = linear_probe(x_fit, y_q, x_held, y_q_held)
        row["grid"] = grid_probe(x_fit, y_fit, x_held, y_held, held_records, len(test))
        if args.fit_small:
            k = args.fit_small
            row[f"grid_fit{k}"] = grid_probe(x_fit[:k], y_fit[:k], x_held, y_held, held_records, len(test))
        if args.views:
            dim = model.config.vision_config.out_hidden_size
            p_fit, p_held = pooled(x_fit, dim), pooled(x_held, dim)
            y_fit_s, y_held_s = [str(y) for y in y_fit], [str(y) for y in y_held]
            row["views"] = {
                f"{view}/{target}": linear_probe(xf, yf, xh, yh, per_feature=scale)
                for view, xf, xh, scale in (
                    ("pooled", p_fit, p_held, True),
                    ("unscaled", x_fit, x_held, False),
                    ("pooled unscaled", p_fit, p_held, False),
                )
                for target, yf, yh in (
                    ("ratio", *quartile_labels[QUANTITIES[2]]),
                    ("grid", y_fit_s, y_held_s),
                )
            }
        out["policies"][name] = row
        print(name, json.dumps(row, default=float), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
