"""GRPO, DAPO, Dr. GRPO and PAPO side by side, from one SFT starting point, on the quickstart scale.

`embodied experiment recipes --config configs/experiment_recipes.yaml` runs:

1. the quickstart dataset (generated unless `data.root` already holds it),
2. a starting policy: `recipes.start` if given, else `recipes.sft_steps` of SFT from the tiny model, stopped
   early on purpose so that reinforcement learning has something left to learn,
3. for every preset in `recipes.arms` (YAML files layered on this config): `recipes.steps` GRPO steps from
   that same starting point with the same seed, validation accuracy every `recipes.eval_every` steps,
4. held-out test accuracy per arm with its 95% interval, and the first step where validation accuracy reached
   `recipes.target`.

It writes `recipes.md` and `recipes.json` (the table) and `recipes.png` (validation accuracy per step).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path


def steps_to(curve: list[tuple[int, float]], target: float) -> int | None:
    """First step whose accuracy is >= target (None if never)."""
    return next((s for s, acc in curve if acc >= target), None)


def _start_policy(cfg, out: Path, train, val, progress: bool) -> Path:
    from embodied.policy.model import load, save_policy
    from embodied.train.sft import train_sft

    if cfg.recipes.start:
        return Path(cfg.recipes.start)
    path = out / "start_model"
    marker = out / "start_model.json"
    want = {"sft": dataclasses.asdict(cfg.sft) | {"steps": cfg.recipes.sft_steps}, "seed": cfg.seed}
    if (path / "config.json").is_file() and marker.is_file() and json.loads(marker.read_text()) == want:
        print(f"reusing the starting policy {path}")
        return path
    model, processor = load(cfg.policy)
    sft = dataclasses.replace(cfg.sft, steps=cfg.recipes.sft_steps, checkpoint_every=0)
    train_sft(model, processor, train, sft, cfg.video, out / "start_sft", val, cfg.seed, progress)
    save_policy(model, processor, path)
    marker.write_text(json.dumps(want))
    return path


def run(cfg, out: Path, progress: bool = True) -> dict:
    from embodied.config import load_config
    from embodied.data.build import dataset_matches, generate_dataset
    from embodied.data.load import load_split
    from embodied.eval.loop import evaluate
    from embodied.policy.model import load_policy
    from embodied.train.common import seed_everything
    from embodied.train.grpo import train_grpo
    from embodied.train.metrics import read_metrics

    rc = cfg.recipes
    if not dataset_matches(cfg.data):
        generate_dataset(cfg.data, progress=progress)
    train = load_split(cfg.data.root, "train", cfg.video, progress)
    val = load_split(cfg.data.root, "val", cfg.video, progress)
    test = load_split(cfg.data.root, "test", cfg.video, progress)
    val = val[: rc.eval_examples]
    start = _start_policy(cfg, out, train, val, progress)
    model, processor = load_policy(start, cfg.policy.dtype, cfg.policy.device)
    start_val = evaluate(model, processor, val, cfg.video, choice=False, progress=False)["accuracy"]
    start_test = evaluate(model, processor, test, cfg.video, choice=False, progress=False)
    rows = []
    for arm_path in rc.arms:
        name = Path(arm_path).stem
        arm = load_config(arm_path, base=cfg)
        grpo = dataclasses.replace(arm.grpo, steps=rc.steps, eval_every=rc.eval_every, eval_examples=len(val))
        arm_out = out / name
        (arm_out / "metrics.jsonl").unlink(missing_ok=True)
        seed_everything(cfg.seed)
        model, processor = load_policy(start, cfg.policy.dtype, cfg.policy.device)
        t0 = time.perf_counter()
        train_grpo(model, processor, train, grpo, cfg.video, arm_out, val, cfg.seed, progress)
        wall = time.perf_counter() - t0
        metrics = read_metrics(arm_out / "metrics.jsonl")
        curve = [(0, start_val)] + [(r["step"], r["eval/accuracy"]) for r in metrics if "eval/accuracy" in r]
        res = evaluate(model, processor, test, cfg.video, choice=False, progress=False)
        masked = [r["papo/accuracy_masked"] for r in metrics if "papo/accuracy_masked" in r]
        rows.append(
            {
                "arm": name,
                "preset": arm_path,
                "test_accuracy": round(res["accuracy"], 4),
                "test_ci95": [round(x, 4) for x in res["ci95"]],
                "test_unparseable": round(res["unparseable"], 4),
                "final_val_accuracy": round(curve[-1][1], 4),
                "steps_to_target": steps_to(curve, rc.target),
                "val_curve": curve,
                "masked_input_accuracy": round(sum(masked) / len(masked), 4) if masked else None,
                "wall_s": round(wall, 1),
            }
        )
        print(f"[{name}] test {res['accuracy']:.3f}, steps to {rc.target}: {rows[-1]['steps_to_target']}")
    result = {
        "start": {"policy": str(start), "val_accuracy": start_val, "test_accuracy": start_test["accuracy"]},
        "grpo_steps": rc.steps,
        "target": rc.target,
        "n_val": len(val),
        "n_test": len(test),
        "arms": rows,
    }
    (out / "recipes.json").write_text(json.dumps(result, indent=2))
    (out / "recipes.md").write_text(recipes_table(result))
    plot_recipe_curves(rows, out / "recipes.png", rc.target)
    print(recipes_table(result))
    return result


def recipes_table(result: dict) -> str:
    t = result["target"]
    lines = [
        f"Start: validation accuracy {result['start']['val_accuracy']:.3f}, test "
        f"{result['start']['test_accuracy']:.3f}; {result['grpo_steps']} GRPO steps per arm; "
        f"n_val = {result['n_val']}, n_test = {result['n_test']}.",
        "",
        f"| arm | test accuracy [95% CI] | unparseable | final val | steps to {t} | masked-input acc | wall s"
        " |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["arms"]:
        lo, hi = r["test_ci95"]
        masked = "-" if r["masked_input_accuracy"] is None else f"{r['masked_input_accuracy']:.3f}"
        reached = r["steps_to_target"] if r["steps_to_target"] is not None else "not reached"
        lines.append(
            f"| {r['arm']} | {r['test_accuracy']:.3f} [{lo:.3f}, {hi:.3f}] | {r['test_unparseable']:.3f} | "
            f"{r['final_val_accuracy']:.3f} | {reached} | {masked} | {r['wall_s']} |"
        )
    return "\n".join(lines) + "\n"


def plot_recipe_curves(rows: list[dict], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for r in rows:
        steps, acc = zip(*r["val_curve"])
        ax.plot(steps, acc, marker="o", ms=3, label=r["arm"])
    ax.axhline(target, color="grey", ls="--", lw=0.8)
    ax.set(xlabel="GRPO step", ylabel="validation accuracy", ylim=(0, 1.02))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
