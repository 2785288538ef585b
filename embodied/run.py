"""What each `embodied` command does, as plain functions of a `Config` (the CLI only parses arguments)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from embodied.config import Config, as_schema, to_yaml
from embodied.data.build import ensure_dataset, generate_dataset
from embodied.data.load import load_split
from embodied.environment import describe, stamped
from embodied.envs import answer_examples, is_interactive
from embodied.envs.config import Turns
from embodied.eval.loop import MCQEval, evaluate
from embodied.eval.signature import input_signature
from embodied.eval.stats import format_result, markdown_table
from embodied.experiments.config import schema_of
from embodied.policy.config import RolloutConfig
from embodied.policy.engines import make_engine
from embodied.policy.fits import check_command
from embodied.policy.model import count_parameters, load, save_policy
from embodied.policy.sampling import sync_engine
from embodied.registry import registry_of
from embodied.report import write_report
from embodied.train.common import seed_everything
from embodied.train.metrics import plot_curves, read_metrics
from embodied.train.tracking import configure as configure_tracking


def _run_dir(cfg: Config, command: str) -> Path:
    out = Path(cfg.run_dir or f"runs/{command}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(to_yaml(cfg))
    (out / "environment.json").write_text(json.dumps(describe(), indent=2))  # what made this run's files
    return out


ROLLOUT_COMMANDS = ("grpo", "expert", "eval", "quickstart", "experiment/env_feedback")
"""The commands whose answers come from `rollout.engine`."""


def refuse_unread(cfg: Config, command: str) -> None:
    """Refuse, in one line, a setting this command would silently drop: another command's section changed
    in a config built for it (the command line refuses it when it loads, `embodied.cli`), or later-turn
    settings for a command that plays no episodes."""
    schema = schema_of(command)
    mine = {f.name for f in dataclasses.fields(schema)}
    for f in dataclasses.fields(cfg):
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if f.name not in mine and getattr(cfg, f.name) != default:
            raise ValueError(
                f"{f.name}.* is not read by `embodied {command.replace('/', ' ')}` (its config is "
                f"{schema.__name__}): drop it from the command line or the config file"
            )
    Turns.of(cfg.env)  # every env.turns setting is checked (embodied.envs.config.check_turns)
    if cfg.rollout != RolloutConfig() and command not in ROLLOUT_COMMANDS:
        raise ValueError(
            f"rollout.engine={cfg.rollout.engine}: `embodied {command.replace('/', ' ')}` samples no "
            f"rollouts (read by {', '.join(ROLLOUT_COMMANDS)})"
        )
    if (
        cfg.env.turns > 1
        and command not in ("grpo", "expert", "eval")
        and not command.startswith("experiment")
    ):
        raise ValueError(
            f"env.turns={cfg.env.turns}: `embodied {command}` plays no interactive episodes (multi-turn "
            "episodes are trained by `embodied grpo` or `expert` and evaluated by `embodied eval`)"
        )


def refuse_turns_on_questions(cfg: Config, examples, split: str) -> None:
    """`env.turns` > 1 plays interactive episodes: refuse it on a split of multiple-choice questions."""
    if cfg.env.turns > 1 and not all(is_interactive(x.record) for x in examples):
        raise ValueError(
            f"{cfg.data.root}/{split}: env.turns={cfg.env.turns} plays interactive episodes, and this split "
            "holds multiple-choice questions; set env.turns=1 (or data.root to episodes: embodied generate "
            "--episodes)"
        )


def _setup(cfg: Config, command: str) -> Path:
    refuse_unread(cfg, command)
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


def generate_episodes(cfg: Config, progress: bool = True) -> dict:
    """`embodied generate --episodes`: the `env` section's interactive episodes (train and test splits) under
    `env.root`, for `embodied grpo`, `expert` and `eval` with `data.root` set to it."""
    from embodied.data.episodes import generate_episodes as write_episodes

    if cfg.data.from_videos:
        raise ValueError("--episodes writes simulated interactive episodes; it takes no --from-videos")
    manifest = write_episodes(cfg.env, progress=progress)
    keys = ("counts", "skipped", "content_hash", "wall_s")
    return {k: manifest[k] for k in keys if k in manifest} | {"root": cfg.env.root}


def _write_eval(out: Path, name: str, result: dict, title: str = "", table_fn=markdown_table) -> str:
    """`eval_<name>.json` and its markdown table `eval_<name>.md` (`table_fn`); returns the table."""
    (out / f"eval_{name}.json").write_text(json.dumps(stamped(result), indent=2))
    table = table_fn(result, title or name)
    (out / f"eval_{name}.md").write_text(table)
    return table


def eval(cfg: Config, progress: bool = True) -> dict:  # noqa: A001 - the command's name
    """Evaluate `policy.path` (or the model served at `eval.endpoint`) on `eval.split`, or run the
    `eval.baseline` shortcut audit instead."""
    from embodied.eval.answerer import check_media
    from embodied.eval.baselines import MODEL_FREE, check_baseline, model_free_eval
    from embodied.eval.stats import resolve_k

    e = cfg.eval
    check_baseline(e.baseline)
    check_media(e.media)
    resolve_k(e.samples, e.k)  # a bad eval.k fails before the model and the videos load
    if e.endpoint:  # a URL with user:password@ stops here, before a config, a log or a title holds it
        from embodied.eval.endpoint import check_url

        if cfg.rollout.engine != "hf":
            raise ValueError(f"rollout.engine={cfg.rollout.engine} with eval.endpoint: the server answers")

        check_url(e.endpoint)
    out = _setup(cfg, "eval")
    if e.baseline in MODEL_FREE:  # no model and no video: records only
        result = model_free_eval(cfg.data.root, e.split, e.baseline, cfg.seed, e.samples, e.k, e.limit)
        skipped, who = [], e.baseline
    else:
        skipped: list[str] = []
        source, examples = _source_and_examples(cfg, out, progress, skipped)
        if any(is_interactive(x.record) for x in examples):
            return _eval_env(cfg, source, examples, skipped, out, progress)
        result = _eval_mcq(cfg, source, examples, progress)
        who = _who(cfg, source) + ("" if e.baseline == "none" else f" ({e.baseline} baseline)")
    result["skipped_videos"] = skipped
    name = e.split if e.baseline == "none" else f"{e.split}_{e.baseline}"
    print(_write_eval(out, name, result, f"{who} on {cfg.data.root}/{e.split}"))
    print(f"{who} on {cfg.data.root}/{e.split}: {format_result(result)}")
    _refuse_none_answered(result)
    return {k: v for k, v in result.items() if k != "predictions"}


def _source_and_examples(cfg: Config, out: Path, progress: bool, skipped: list[str]) -> tuple:
    """The answer source (a loaded policy, or the served model) and the split's examples. A server that
    cannot even be asked for its model (connection refused, no /v1) still leaves a result behind, every
    question unanswered with the cause, before the run fails naming it."""
    from embodied.eval.endpoint import Unreachable

    e = cfg.eval
    if not e.endpoint:
        check_command(cfg, "eval")  # a policy too big for the device stops here, in one line
        source = load(cfg.policy)
    examples = load_split(cfg.data.root, e.split, cfg.video, progress, e.limit, skipped)
    examples = answer_examples(examples, cfg.env.answer)  # interactive records in env.answer's form
    refuse_turns_on_questions(cfg, examples, e.split)
    if e.endpoint:
        try:
            source = _served(cfg, out)
        except Unreachable as err:
            _write_unanswered(cfg, out, examples, str(err))
            raise ValueError(f"none of the {len(examples)} questions was answered: {err}") from err
    return source, examples


def _write_unanswered(cfg: Config, out: Path, examples, cause: str) -> None:
    """`eval_<split>.json` of a served evaluation whose server could not be asked: n = 0 and every question
    listed under `failed` with `cause`, so `embodied compare` and `report` show it as none answered."""
    from embodied.data.schema import kind
    from embodied.eval.endpoint import redact
    from embodied.eval.env_stats import env_markdown, summarize_env
    from embodied.eval.stats import prediction_stats

    e = cfg.eval
    episodes = any(is_interactive(x.record) for x in examples)
    result = summarize_env([]) if episodes else prediction_stats([])
    result["requested"] = len(examples)
    result["failed"] = [
        {"id": x.record["id"], "task" if episodes else "family": x.record.get("task") or kind(x.record),
         "error": cause}
        for x in examples
    ]  # fmt: skip
    result["settings"] = {"baseline": e.baseline, "media": "video" if e.media == "video" else "images"}
    url = redact(e.endpoint)
    result["endpoint"] = {"url": url, "model": e.model, "requests": 0, "sent": 0, "cached": 0}
    result["endpoint"] |= {"failed": len(examples), "cause": cause}
    media = result["settings"]["media"]
    result["signature"] = input_signature(examples, cfg.video, media, cfg.data.root, e.split)
    result["predictions"] = []
    name = e.split if e.baseline == "none" else f"{e.split}_{e.baseline}"
    title = f"{e.model or 'the served model'} at {url} on {cfg.data.root}/{e.split}"
    _write_eval(out, name, result, title, env_markdown if episodes else markdown_table)


def _who(cfg: Config, source=None) -> str:
    """What was evaluated, for titles: the policy folder, or the served model and where."""
    if source is not None and hasattr(source, "client"):
        return f"{source.client.model} at {source.client.url}"
    e = cfg.eval
    return f"{e.model or 'the served model'} at {e.endpoint}" if e.endpoint else cfg.policy.path


def _refuse_none_answered(result: dict) -> None:
    """An evaluation that answered nothing fails (non-zero exit), naming the likely cause; its result files
    are written first, so `embodied compare` and `report` show it as none answered."""
    if result.get("n") == 0 and result.get("requested"):
        cause = result.get("endpoint", {}).get("cause", "no question could be answered")
        raise ValueError(f"none of the {result['requested']} questions was answered: {cause}")


def _signed(cfg: Config, source, examples, result: dict) -> dict:
    """`result` with its input signature (`embodied.eval.signature`) and, for a served model, its endpoint
    record and the notes its summary prints: who answered with what counts, and that a video-native model
    shown images is not comparable with a local video run."""
    e = cfg.eval
    media = getattr(source, "media", "images" if e.media == "images" else "video")
    result["signature"] = input_signature(examples, cfg.video, media, cfg.data.root, e.split)
    if not hasattr(source, "client"):
        return result
    ep = result["endpoint"]
    notes = [
        f"served by {ep['url']} (model {ep['model']}): {ep['requests']} requests, {ep['sent']} received by "
        f"the server, {ep['cached']} from an earlier run's cache, {ep['failed']} failed"
    ]
    if e.media == "auto" and any("video" in x.record for x in examples):
        notes.append(
            "the served model got each clip's frames as images (eval.media=auto through an endpoint): a "
            "video-native model (Qwen2.5-VL, Qwen3-VL, Qwen3.5) evaluated locally on video is not comparable "
            "with this result; compare with a local eval.media=images run"
        )
    if result.get("settings", {}).get("sampling"):
        notes.append(f"sampled figures {result['settings']['sampling']}")
    result["notes"] = notes
    return result


def _served(cfg: Config, out: Path):
    """The `EndpointAnswerer` of `eval.endpoint`, its responses cached under `eval.cache_dir` (default
    `run_dir/endpoint_cache`)."""
    from embodied.eval.endpoint import EndpointClient
    from embodied.eval.served import EndpointAnswerer

    e = cfg.eval
    cache = Path(e.cache_dir) if e.cache_dir else out / "endpoint_cache"
    client = EndpointClient(
        e.endpoint, e.model, cache, e.api_key_env, e.concurrency, e.timeout, e.retries, e.backoff
    )
    args = (e.max_new_tokens, e.media, e.processor_kwargs, e.choice, e.video_url)
    return EndpointAnswerer(client, cfg.video, *args)


def _endpoint_record(served, seconds: float, result: dict) -> dict:
    """What the endpoint did for a result: where, which model, requests by fate, tokens and seconds, and when
    nothing was answered the likely cause."""
    from embodied.eval.endpoint import likely_cause, redact

    usage = dataclasses.asdict(served.client.usage)
    record = {"url": redact(served.client.url), "model": served.client.model, "seconds": round(seconds, 2)}
    if result.get("n") == 0 and result.get("requested"):
        record["cause"] = likely_cause(served.client)
    return record | usage


def _eval_mcq(cfg: Config, source, examples, progress: bool) -> dict:
    """MCQ evaluation of a local `(model, processor)` or a served model (`EndpointAnswerer`)."""
    from embodied.eval.loop import evaluate_answers

    how, t0 = MCQEval.of(cfg, progress=progress), time.perf_counter()
    if isinstance(source, tuple):
        model, processor = source
        engine = make_engine(cfg, model, processor)
        return _signed(cfg, source, examples, evaluate(model, processor, examples, cfg.video, how, engine))
    result = evaluate_answers(source, examples, how)
    result["settings"]["max_new_tokens"] = how.max_new_tokens
    result["endpoint"] = _endpoint_record(source, time.perf_counter() - t0, result)
    _print_endpoint(result)
    return _signed(cfg, source, examples, result)


def tokens_sent(ep: dict) -> str:
    """The tokens a served run fetched, as the server reported them ("not reported" when it sent no usage)."""
    p, c = ep["sent_prompt_tokens"], ep["sent_completion_tokens"]
    if p is None and c is None:
        return "tokens not reported by the server" if ep["sent"] else "no tokens sent"
    missing = f" ({ep['unreported']} answers without usage)" if ep.get("unreported") else ""
    return f"{p or 0} + {c or 0} tokens sent{missing}"


def _print_endpoint(result: dict) -> None:
    ep = result["endpoint"]
    read = ", ".join(f"{v} {k}" for k, v in ep["read"].items()) or "none"
    print(
        f"endpoint {ep['url']} ({ep['model']}): {ep['requests']} requests: {ep['sent']} received by the "
        f"server, {ep['cached']} from an earlier run's cache, {ep['repeated']} repeats answered within the "
        f"run, {ep['unreached']} never reached it, {ep['failed']} failed, {ep['retries']} retries; "
        f"answers read as {read}; {tokens_sent(ep)}; "
        f"{ep['seconds']} s"
        + (f"; {len(result['failed'])} unanswered, not scored" if result.get("failed") else "")
    )
    if ep["errors"]:  # e.g. a wrong eval.model ("pinned to ..."), a video the server cannot read
        print(f"endpoint errors (first {len(ep['errors'][:3])}): " + " | ".join(ep["errors"][:3]))


def _eval_env(cfg: Config, source, examples, skipped, out: Path, progress: bool) -> dict:
    """`embodied eval` on interactive episodes: greedy answers executed in MuJoCo and, with `eval.samples`,
    best-of-N with the simulator as the verifier and majority vote for each N in `eval.k`; with
    `env.turns` > 1 each failed answer's outcome clip is shown back for another turn."""
    from embodied.eval.env_loop import EnvEval, evaluate_env, evaluate_env_answers
    from embodied.eval.env_stats import env_markdown

    e, t0 = cfg.eval, time.perf_counter()
    if e.baseline != "none" or not all(is_interactive(x.record) for x in examples):
        raise ValueError(
            f"{cfg.data.root}/{e.split}: interactive episodes are evaluated by the simulator, alone and "
            "without eval.baseline; put MCQs and episodes in separate datasets"
        )
    how = EnvEval.of(cfg)  # eval.*, env.backend, env.format_weight, env.turns... and the seed
    if isinstance(source, tuple):
        model, processor = source
        engine = make_engine(cfg, model, processor)
        result = evaluate_env(model, processor, examples, cfg.video, how, progress, engine=engine)
    else:
        result = evaluate_env_answers(source, examples, how, progress)
        result["endpoint"] = _endpoint_record(source, time.perf_counter() - t0, result)
        _print_endpoint(result)
    result["skipped_videos"] = skipped
    _signed(cfg, source, examples, result)
    title = f"{_who(cfg, source)} on {cfg.data.root}/{e.split}"
    print(_write_eval(out, e.split, result, title, env_markdown))  # its notes end the table
    _refuse_none_answered(result)
    return {k: v for k, v in result.items() if k != "predictions"}


def compare(run_dirs: list[str], out: str | Path = "runs/compare") -> Path:
    """`embodied compare RUN_DIR...`: every evaluation of the folders in one ranked table and one figure,
    shortcut baselines beside their results, in `out/compare.html` (the report's style) with the ranking in
    `out/compare.json`; returns the page's path."""
    from embodied.eval.compare import comparison_html, ranking, read_results
    from embodied.report import STYLE

    results = read_results(run_dirs)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "compare.json").write_text(json.dumps(ranking(results), indent=2))
    page = folder / "compare.html"
    page.write_text(comparison_html(results, STYLE), encoding="utf-8")
    return page


def _train(cfg: Config, stage: str, progress: bool) -> dict:
    """Load `policy.path`, run the `stage` loop on the train split, save `run_dir/model` and the curves."""
    from embodied.rl.rewards import rewards_for
    from embodied.train.distributed import Processes
    from embodied.train.grpo import train_grpo
    from embodied.train.sft import train_sft
    from embodied.train.state import Run

    loop, stage_cfg = {"sft": (train_sft, cfg.sft), "grpo": (train_grpo, cfg.grpo)}[stage]
    check_command(cfg, stage)  # a policy too big for the device stops here, in one line
    # the reward routes questions, episodes or both; the turns are how episodes are played (env.turns, ...)
    extra = {"reward_fn": rewards_for(cfg), "turns": Turns.of(cfg.env)} if stage == "grpo" else {}
    procs = Processes(cfg.mixed_precision, cpu=cfg.policy.device == "cpu", strategy=cfg.distributed)
    out = _setup(cfg, stage)
    model, processor = load(cfg.policy, stage)
    if stage == "grpo":  # the engine that samples the rollouts, synced after every optimizer step
        extra["engine"] = make_engine(cfg, model, processor)
    train = answer_examples(load_split(cfg.data.root, "train", cfg.video, progress), cfg.env.answer)
    refuse_turns_on_questions(cfg, train, "train")
    val = (  # only a stage that validates needs the split (episode datasets have none)
        answer_examples(load_split(cfg.data.root, "val", cfg.video, progress), cfg.env.answer)
        if stage_cfg.eval_every > 0
        else []
    )
    run = Run.of(cfg, model, processor, train, out, val=val, progress=progress, procs=procs, **extra)
    info = loop(stage_cfg, dataclasses.replace(run, resume=cfg.resume, config_yaml=to_yaml(cfg)))
    weights = procs.full_state(model)[0] if procs.fsdp else None  # FSDP: gathered by every process
    if procs.main:  # the other processes hold the same weights
        save_policy(model, processor, out / "model", weights)
        plot_curves(read_metrics(out / "metrics.jsonl"), out / "curves.png")
        write_report(out)
    procs.close()
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
    from embodied.train.state import Run

    check_command(cfg, "expert")  # a policy too big for the device stops here, in one line
    out = _setup(cfg, "expert")
    model, processor = load(cfg.policy, "expert")
    train = answer_examples(load_split(cfg.data.root, "train", cfg.video, progress), cfg.env.answer)
    refuse_turns_on_questions(cfg, train, "train")
    engine = make_engine(cfg, model, processor)
    run = Run(model, processor, train, out, progress=progress, resume=cfg.resume, config_yaml=to_yaml(cfg))
    info = train_expert_config(cfg, dataclasses.replace(run, engine=engine))
    save_policy(model, processor, out / "model")
    plot_curves(read_metrics(out / "metrics.jsonl"), out / "curves.png")
    write_report(out)
    return info | {"model": str(out / "model")}


def export(cfg: Config, progress: bool = True) -> dict:
    """Write `data.root` as parquet for verl or EasyR1, or as an lmms-eval task folder (`export.format`),
    under `export.out` or `run_dir`."""
    from embodied.integrations.export import export_dataset

    e = cfg.export
    out = Path(e.out) if e.out else _run_dir(cfg, "export")
    if e.format == "lmms-eval":
        return _export_lmms_eval(cfg, out)
    return export_dataset(cfg.data.root, out, e.format, cfg.video, e.splits, e.media_root)


def _export_lmms_eval(cfg: Config, out: Path) -> dict:
    """`export --format lmms-eval`: one split as an lmms-eval task folder, asked and scored as `embodied eval`
    asks and scores it (`eval.max_new_tokens`, `env.answer`, `env.backend`, `env.format_weight`)."""
    from embodied.integrations.lmms_export import export_lmms_eval

    e = cfg.export
    if len(e.splits) > 1:
        raise ValueError(f"export.splits={list(e.splits)}: an lmms-eval export holds one split; name one")
    env = cfg.env
    return export_lmms_eval(
        cfg.data.root, out, cfg.video, split=e.splits[0] if e.splits else "test", name=e.name,
        media_root=e.media_root, max_new_tokens=cfg.eval.max_new_tokens, answer=env.answer,
        backend=env.backend, format_weight=env.format_weight, pixel_multiple=e.pixel_multiple,
    )  # fmt: skip


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
    from embodied.train.state import Run

    check_command(cfg, "quickstart")  # a policy too big for the device stops here, in one line
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
    engine = make_engine(cfg, model, processor)
    skipped: list[str] = []
    train = load_split(cfg.data.root, "train", cfg.video, progress, skipped=skipped)
    val = load_split(cfg.data.root, "val", cfg.video, progress)
    test = load_split(cfg.data.root, "test", cfg.video, progress)
    t = lap("load", t)

    results: dict[str, dict] = {}

    def run_eval(stage: str) -> None:
        nonlocal t
        e = cfg.eval  # not MCQEval.of: the quickstart has never read eval's baseline, samples or media
        how = MCQEval(e.batch_size, e.max_new_tokens, e.choice, progress, desc=f"eval {stage}")
        sync_engine(engine, model)  # this stage's weights (keep-best may have gone back to earlier ones)
        res = evaluate(model, processor, test, cfg.video, how, engine)
        results[stage] = res
        res["signature"] = input_signature(test, cfg.video, "video", cfg.data.root, "test")  # for compare
        _write_eval(out, stage, res)
        print(f"[{stage}] {format_result(res)}")
        t = lap(f"eval_{stage}", t)

    run_eval("initial")
    sft_cfg = dataclasses.replace(cfg.sft, targets=cfg.quickstart.sft_targets)
    run = Run.of(cfg, model, processor, train, out, val=val, progress=progress)
    train_sft(sft_cfg, run)
    t = lap("sft", t)
    run_eval("sft")
    save_policy(model, processor, out / "sft_model")
    t = time.perf_counter()
    every = cfg.grpo.eval_every or cfg.quickstart.grpo_eval_every  # held-out points through GRPO
    keep_best = bool(every) and (cfg.grpo.keep_best or cfg.quickstart.keep_best)
    grpo_cfg = dataclasses.replace(cfg.grpo, eval_every=every, keep_best=keep_best)
    grpo_run = train_grpo(grpo_cfg, dataclasses.replace(run, engine=engine))
    t = lap("grpo", t)
    run_eval("grpo")
    save_policy(model, processor, out / "grpo_model")
    plot_curves(read_metrics(out / "metrics.jsonl"), out / "curves.png")
    write_examples(out / "examples", test, results, cfg.data.root, n=4)
    summary = _quickstart_summary(cfg, results, train, test, skipped, count_parameters(model), timings)
    summary["grpo_best_step"] = grpo_run.get("best_step")  # None: the last step's weights (keep_best off)
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    summary = stamped(summary)  # the versions and lock that made it
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    write_report(out)
    print(f"summary: {out / 'summary.json'}; curves: {out / 'curves.png'}; examples: {out / 'examples'}")
    return summary


def named(package: str, name: str, cfg: Config, progress: bool = True) -> dict:
    """Run bench or experiment `name`'s `run(cfg, out, progress)` (`package`'s own module, or one registered
    there); its JSON goes to run_dir."""
    module = registry_of(package).get(name)
    kind = package.rsplit(".", 1)[-1].rstrip("s")
    refuse_unread(cfg, f"{kind}/{name}")
    cfg = as_schema(cfg, schema_of(f"{kind}/{name}"))  # e.g. a core `Config`: the section at its defaults
    out = _setup(cfg, f"{kind}/{name}")
    result = stamped(module.run(cfg, out, progress=progress))  # the versions and lock that made it
    (out / f"{kind}_{name}.json").write_text(json.dumps(result, indent=2))
    return result
