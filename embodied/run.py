"""What each `embodied` command does, as plain functions of a `Config` (the CLI only parses arguments)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from embodied.config import Config, to_yaml
from embodied.data.build import ensure_dataset, generate_dataset
from embodied.data.load import load_split
from embodied.envs import answer_examples, is_interactive
from embodied.eval.loop import evaluate, format_result, markdown_table
from embodied.policy.model import count_parameters, load, save_policy
from embodied.report import write_report
from embodied.train.common import seed_everything
from embodied.train.metrics import plot_curves, read_metrics
from embodied.train.tracking import configure as configure_tracking


def _run_dir(cfg: Config, command: str) -> Path:
    out = Path(cfg.run_dir or f"runs/{command}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(to_yaml(cfg))
    return out


def _setup(cfg: Config, command: str) -> Path:
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    out = _run_dir(cfg, command)
    configure_tracking(cfg.log, out, cfg)  # log.backends: TensorBoard, W&B
    return out


def generate(cfg: Config, progress: bool = True) -> dict:
    manifest = generate_dataset(cfg.data, progress=progress)
    keys = ("counts", "answers", "skipped", "content_hash", "wall_s", "clips_per_s")
    return {k: manifest[k] for k in keys if k in manifest} | {"root": cfg.data.root}


def _write_eval(out: Path, name: str, result: dict, title: str = "", table_fn=markdown_table) -> str:
    """`eval_<name>.json` and its markdown table `eval_<name>.md` (`table_fn`); returns the table."""
    (out / f"eval_{name}.json").write_text(json.dumps(result, indent=2))
    table = table_fn(result, title or name)
    (out / f"eval_{name}.md").write_text(table)
    return table


def eval(cfg: Config, progress: bool = True) -> dict:  # noqa: A001 - the command's name
    """Evaluate `policy.path` on `eval.split`, or run the `eval.baseline` shortcut audit instead."""
    from embodied.eval.baselines import MODEL_FREE, check_baseline, model_free_eval
    from embodied.eval.stats import resolve_k

    e = cfg.eval
    check_baseline(e.baseline)
    resolve_k(e.samples, e.k)  # a bad eval.k fails before the model and the videos load
    out = _setup(cfg, "eval")
    if e.baseline in MODEL_FREE:  # no model and no video: records only
        result = model_free_eval(cfg.data.root, e.split, e.baseline, cfg.seed, e.samples, e.k, e.limit)
        skipped, who = [], e.baseline
    else:
        model, processor = load(cfg.policy)
        skipped: list[str] = []
        examples = load_split(cfg.data.root, e.split, cfg.video, progress, e.limit, skipped)
        examples = answer_examples(examples, cfg.env.answer)  # interactive records in env.answer's form
        if any(is_interactive(x.record) for x in examples):
            return _eval_env(cfg, model, processor, examples, skipped, out, progress)
        result = evaluate(
            model,
            processor,
            examples,
            cfg.video,
            e.batch_size,
            e.max_new_tokens,
            e.choice,
            progress,
            baseline=e.baseline,
            samples=e.samples,
            k=e.k,
            temperature=e.temperature,
            seed=cfg.seed,
        )
        who = cfg.policy.path + ("" if e.baseline == "none" else f" ({e.baseline} baseline)")
    result["skipped_videos"] = skipped
    name = e.split if e.baseline == "none" else f"{e.split}_{e.baseline}"
    print(_write_eval(out, name, result, f"{who} on {cfg.data.root}/{e.split}"))
    print(f"{who} on {cfg.data.root}/{e.split}: {format_result(result)}")
    return {k: v for k, v in result.items() if k != "predictions"}


def _eval_env(cfg: Config, model, processor, examples, skipped, out: Path, progress: bool) -> dict:
    """`embodied eval` on interactive episodes: greedy answers executed in MuJoCo and, with `eval.samples`,
    best-of-N with the simulator as the verifier and majority vote for each N in `eval.k`."""
    from embodied.eval.envs import env_markdown, evaluate_env

    e = cfg.eval
    if e.baseline != "none" or not all(is_interactive(x.record) for x in examples):
        raise ValueError(
            f"{cfg.data.root}/{e.split}: interactive episodes are evaluated by the simulator, alone and "
            "without eval.baseline; put MCQs and episodes in separate datasets"
        )
    result = evaluate_env(
        model,
        processor,
        examples,
        cfg.video,
        cfg.env.backend,
        e.batch_size,
        e.max_new_tokens,
        cfg.env.format_weight,
        progress,
        samples=e.samples,
        k=e.k,
        temperature=e.temperature,
        seed=cfg.seed,
    )
    result["skipped_videos"] = skipped
    print(_write_eval(out, e.split, result, f"{cfg.policy.path} on {cfg.data.root}/{e.split}", env_markdown))
    return {k: v for k, v in result.items() if k != "predictions"}


def _train(cfg: Config, stage: str, progress: bool) -> dict:
    """Load `policy.path`, run the `stage` loop on the train split, save `run_dir/model` and the curves."""
    from embodied.rl.rewards import rewards_for
    from embodied.train.distributed import Processes
    from embodied.train.grpo import train_grpo
    from embodied.train.sft import train_sft

    loop, stage_cfg = {"sft": (train_sft, cfg.sft), "grpo": (train_grpo, cfg.grpo)}[stage]
    extra = {"reward_fn": rewards_for(cfg)} if stage == "grpo" else {}  # questions, episodes or both
    procs = Processes(cfg.mixed_precision, cpu=cfg.policy.device == "cpu", strategy=cfg.distributed)
    out = _setup(cfg, stage)
    model, processor = load(cfg.policy, stage)
    train = answer_examples(load_split(cfg.data.root, "train", cfg.video, progress), cfg.env.answer)
    val = (  # only a stage that validates needs the split (episode datasets have none)
        answer_examples(load_split(cfg.data.root, "val", cfg.video, progress), cfg.env.answer)
        if stage_cfg.eval_every > 0
        else []
    )
    info = loop(
        model,
        processor,
        train,
        stage_cfg,
        cfg.video,
        out,
        val,
        cfg.seed,
        progress,
        resume=cfg.resume,
        config_yaml=to_yaml(cfg),
        procs=procs,
        **extra,
    )
    weights = procs.full_state(model)[0] if procs.fsdp else None  # FSDP: gathered by every process
    if procs.main:  # the other processes hold the same weights
        save_policy(model, processor, out / "model", weights)
        plot_curves(read_metrics(out / "metrics.jsonl"), out / "curves.png")
        write_report(out)
    procs.barrier()
    return info | {"model": str(out / "model")}


def pretrain(cfg: Config, progress: bool = True) -> dict:
    """Caption-pretrain the tiny model on simulator ground truth (embodied/train/pretrain.py)."""
    from embodied.config import SFTConfig
    from embodied.train.pretrain import pretrain_policy

    pc = cfg.pretrain
    out = _setup(cfg, "pretrain")
    (out / "metrics.jsonl").unlink(missing_ok=True)
    sft = SFTConfig(
        steps=pc.steps,
        batch_size=pc.batch_size,
        lr=pc.lr,
        warmup_steps=pc.warmup_steps,
        vision_lr_scale=pc.vision_lr_scale,
        restart_every=0,
        eval_every=0,
        checkpoint_every=0,
        log_every=50,
    )
    summary = pretrain_policy(pc, sft, cfg.video, cfg.policy.tiny_seed, out, progress, cfg.policy.device)
    plot_curves(read_metrics(out / "metrics.jsonl"), out / "curves.png")
    return summary


def sft(cfg: Config, progress: bool = True) -> dict:
    return _train(cfg, "sft", progress)


def grpo(cfg: Config, progress: bool = True) -> dict:
    return _train(cfg, "grpo", progress)


def expert(cfg: Config, progress: bool = True) -> dict:
    """Expert iteration (`expert:`) from `policy.path` on `data.root`'s train split: each round keeps the
    best verified of `expert.samples` answers per prompt (the simulator's verdict for interactive episodes,
    the label for questions) and fine-tunes on them; saves `run_dir/model` and the curves."""
    from embodied.train.expert import train_expert_config

    out = _setup(cfg, "expert")
    model, processor = load(cfg.policy, "expert")
    train = answer_examples(load_split(cfg.data.root, "train", cfg.video, progress), cfg.env.answer)
    info = train_expert_config(model, processor, train, cfg, out, progress, cfg.resume, to_yaml(cfg))
    save_policy(model, processor, out / "model")
    plot_curves(read_metrics(out / "metrics.jsonl"), out / "curves.png")
    write_report(out)
    return info | {"model": str(out / "model")}


def export(cfg: Config, progress: bool = True) -> dict:
    """Write `data.root` as parquet for verl or EasyR1 (`export.format`) under `export.out` or `run_dir`."""
    from embodied.integrations.export import export_dataset

    e = cfg.export
    out = Path(e.out) if e.out else _run_dir(cfg, "export")
    return export_dataset(cfg.data.root, out, e.format, cfg.video, e.splits, e.media_root)


def _quickstart_summary(
    cfg: Config, results: dict, train, test, skipped, parameters: int, timings: dict
) -> dict:
    stages = ("initial", "sft", "grpo")
    return {
        "accuracy": {s: round(results[s]["accuracy"], 4) for s in stages},
        "ci95": {s: [round(x, 4) for x in results[s]["ci95"]] for s in stages},
        "choice_accuracy": {s: round(results[s].get("choice_accuracy", float("nan")), 4) for s in stages},
        "unparseable": {s: round(results[s]["unparseable"], 4) for s in stages},
        "chance": round(results["grpo"]["chance"], 4),
        "policy": cfg.policy.path,
        "sft_targets": cfg.quickstart.sft_targets,
        "seed": cfg.seed,
        "data_seed": cfg.data.seed,
        "n_test": len(test),
        "n_train": len(train),
        "skipped_videos": len(skipped),
        "parameters": parameters,
        "timings_s": timings,
        "threads": torch.get_num_threads(),
    }


def quickstart(cfg: Config, progress: bool = True) -> dict:
    """The whole path on the tiny base: data -> eval -> SFT -> eval -> GRPO -> eval, with a summary.

    By default the SFT stage teaches the answer format only (`quickstart.sft_targets=format`), so the
    accuracy it ends at is chance and every point above it is reinforcement learning's."""
    from embodied.eval.examples import write_examples
    from embodied.train.grpo import train_grpo
    from embodied.train.sft import train_sft

    t0 = time.perf_counter()
    out = _setup(cfg, "quickstart")
    (out / "metrics.jsonl").unlink(missing_ok=True)
    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        timings[name] = round(time.perf_counter() - since, 1)
        return time.perf_counter()

    t = time.perf_counter()
    ensure_dataset(cfg.data, progress)
    t = lap("generate", t)
    model, processor = load(cfg.policy, "quickstart")
    skipped: list[str] = []
    train = load_split(cfg.data.root, "train", cfg.video, progress, skipped=skipped)
    val = load_split(cfg.data.root, "val", cfg.video, progress)
    test = load_split(cfg.data.root, "test", cfg.video, progress)
    t = lap("load", t)

    results: dict[str, dict] = {}

    def run_eval(stage: str) -> None:
        nonlocal t
        res = evaluate(
            model,
            processor,
            test,
            cfg.video,
            cfg.eval.batch_size,
            cfg.eval.max_new_tokens,
            cfg.eval.choice,
            progress,
            desc=f"eval {stage}",
        )
        results[stage] = res
        _write_eval(out, stage, res)
        print(f"[{stage}] {format_result(res)}")
        t = lap(f"eval_{stage}", t)

    run_eval("initial")
    sft_cfg = dataclasses.replace(cfg.sft, targets=cfg.quickstart.sft_targets)
    train_sft(model, processor, train, sft_cfg, cfg.video, out, val, cfg.seed, progress)
    t = lap("sft", t)
    run_eval("sft")
    save_policy(model, processor, out / "sft_model")
    t = time.perf_counter()
    train_grpo(model, processor, train, cfg.grpo, cfg.video, out, val, cfg.seed, progress)
    t = lap("grpo", t)
    run_eval("grpo")
    save_policy(model, processor, out / "grpo_model")
    plot_curves(read_metrics(out / "metrics.jsonl"), out / "curves.png")
    write_examples(out / "examples", test, results, cfg.data.root, n=4)
    summary = _quickstart_summary(cfg, results, train, test, skipped, count_parameters(model), timings)
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    write_report(out)
    print(f"summary: {out / 'summary.json'}; curves: {out / 'curves.png'}; examples: {out / 'examples'}")
    return summary


def named(package: str, name: str, cfg: Config, progress: bool = True) -> dict:
    """Run `package.<name>.run(cfg, progress)` (a bench or an experiment); its JSON goes to run_dir."""
    import importlib

    module = importlib.import_module(f"{package}.{name.replace('-', '_')}")
    kind = package.rsplit(".", 1)[-1].rstrip("s")
    out = _setup(cfg, f"{kind}/{name}")
    result = module.run(cfg, out, progress=progress)
    (out / f"{kind}_{name}.json").write_text(json.dumps(result, indent=2))
    return result
