"""Cosmos-Reason1's Table 10 in miniature: does RL on self-supervised questions beat more SFT, per family?

`embodied experiment cosmos -c configs/experiment_cosmos.yaml` runs:

1. the training set (`data`, every family of `configs/physics_mix.yaml` by default) and the held-out
   benchmark (`cosmos.benchmark` at `cosmos.benchmark_n_test` questions, from the seed stream no training
   split draws from), each generated unless its root already holds it;
2. the base policy (`policy.path`) on the benchmark, once;
3. per seed in `cosmos.seeds`, three jobs (`cosmos.workers` at once, each in its own process):
   - **main**: the `cosmos.curriculum` stages (SFT on some families only, e.g. arrow of time first), then
     `sft.steps` of labelled SFT on every family (SFT); `grpo.steps` of GRPO from it (SFT + GRPO);
     from the same SFT policy, continued SFT for as many seconds as the GRPO stage took (`sft.max_seconds`:
     more training without RL, the control); the blind and single-frame baselines of the SFT + GRPO policy;
   - **zero**: `cosmos.format_steps` of format-only SFT (random letters: never a right answer), then
     `grpo.steps` of GRPO (GRPO alone);
   - **transfer**: SFT, then SFT + GRPO and its continued-SFT control, trained only on the families whose
     scene is in `cosmos.transfer_scenes`, evaluated on the benchmark's questions of the same families in
     other scenes (GRPO minus continued SFT on held-out scenes, paired by seed);
4. tables per family (and tier) with the mean over seeds, its 95% Student-t interval and the min-max; the
   targets of the issue checked from them (every family above chance after SFT and after SFT + GRPO; GRPO
   beats continued SFT on the family average, paired by seed; blind and single-frame contain chance).
   `cosmos.sft_only` stops every main job at its SFT row and runs no other job: the cheap measurement of an
   SFT-side lever (mix, curriculum, targets) on every seed.

Every finished job is kept in `seed<S>/<job>/result.json` and reused when its settings match. It writes
`cosmos.md`, `cosmos.json` and `cosmos.png` (`embodied.experiments.cosmos_report`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from pathlib import Path

from embodied.experiments.cosmos_report import write_outputs
from embodied.experiments.reuse import process_data, reuse_or_run, run_jobs

JOBS = ("main", "transfer", "zero")  # longest first


def benchmark_config(cfg):
    """The `data:` section of `cosmos.benchmark` at `cosmos.benchmark_n_test` questions, rendered at the
    training data's size and clip length (a policy trained on 4 frames is asked about 4), in its own root."""
    from embodied.config import load_config

    bench = load_config(cfg.cosmos.benchmark).data
    n, d = cfg.cosmos.benchmark_n_test, cfg.data
    root = f"{bench.root}_n{n}_{d.width}x{d.height}_{d.clip.num_frames}f"
    return dataclasses.replace(bench, n_test=n, width=d.width, height=d.height, clip=d.clip, root=root)


def _load_data(cfg, progress: bool) -> dict:
    """Train and val splits and the benchmark, generated if missing (once per process)."""
    from embodied.data.build import ensure_dataset
    from embodied.data.load import load_split

    bench = benchmark_config(cfg)

    def load() -> dict:
        ensure_dataset(cfg.data, progress)
        ensure_dataset(bench, progress)
        data = {s: load_split(cfg.data.root, s, cfg.video, progress) for s in ("train", "val")}
        return data | {"bench": load_split(bench.root, "test", cfg.video, progress)}

    key = {k: dataclasses.asdict(v) for k, v in (("data", cfg.data), ("bench", bench), ("video", cfg.video))}
    return process_data(key, load, cfg.threads)


def scene(example) -> str:
    return example.record["meta"].get("scene", "")


def bench_eval(
    model, processor, examples, cfg, baseline: str = "none", predictions: Path | None = None
) -> dict:
    """Greedy accuracy on `examples` overall, per family and per family x tier. The per-question rows (id,
    family, tier, answer, the option chosen, the response) go to the JSON-lines file `predictions` if given,
    so an answer's reading can be re-examined without rerunning; the returned row keeps none of them."""
    from embodied.eval.loop import evaluate_free

    r = evaluate_free(model, processor, examples, cfg, baseline=baseline)
    if predictions is not None:
        fields = ("id", "family", "difficulty", "answer", "predicted", "response")
        predictions.parent.mkdir(parents=True, exist_ok=True)
        predictions.write_text(
            "".join(json.dumps({k: p.get(k) for k in fields}) + "\n" for p in r["predictions"])
        )
    keep = ("accuracy", "ci95", "n", "chance", "unparseable")
    return {k: r[k] for k in keep} | {
        "per_family": {f: {k: v[k] for k in keep} for f, v in r["per_family"].items()},
        "per_family_tier": {
            f: {tier: {k: v[k] for k in keep} for tier, v in tiers.items()}
            for f, tiers in r["per_family_tier"].items()
        },
    }


def _sft(model, processor, train, cfg, seed: int, out: Path, progress: bool, **changes) -> dict:
    from embodied.train.sft import train_sft
    from embodied.train.state import Run

    sft = dataclasses.replace(cfg.sft, eval_every=0, checkpoint_every=0, **changes)
    return train_sft(sft, Run(model, processor, train, out, cfg.video, seed=seed, progress=progress))


def _grpo(model, processor, train, cfg, seed: int, out: Path, progress: bool, **changes) -> float:
    from embodied.train.grpo import train_grpo
    from embodied.train.state import Run

    grpo = dataclasses.replace(cfg.grpo, eval_every=0, checkpoint_every=0, **changes)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    t0 = time.perf_counter()
    train_grpo(grpo, Run(model, processor, train, out, cfg.video, seed=seed, progress=progress))
    return time.perf_counter() - t0


def curriculum_examples(train: list, families: list[str]) -> list:
    """The training examples of a curriculum stage's families."""
    chosen = [e for e in train if e.record["family"] in families]
    if not chosen:
        have = sorted({e.record["family"] for e in train})
        raise ValueError(
            f"cosmos.curriculum: no training example of families {families}; the data has {have}"
        )
    return chosen


def check_response_room(cfg, processor, train: list) -> None:
    """Raise when the SFT targets (with `sft.rationale`'s `<think>`, e.g. a trace) are longer than the
    responses GRPO samples or the evaluation generates: they would be cut before their `<answer>`."""
    from embodied.train.sft import longest_target

    need = longest_target(processor, [e.record for e in train], cfg.sft)
    short = {
        key: n
        for key, n in (
            ("grpo.max_new_tokens", cfg.grpo.max_new_tokens),
            ("eval.max_new_tokens", cfg.eval.max_new_tokens),
        )
        if n < need
    }
    if short:
        raise ValueError(
            f"sft.rationale={cfg.sft.rationale}: the longest SFT target is {need} tokens, but {short} would "
            f"cut responses before their answer; set them to at least {need}"
        )


def _main_job(cfg, data: dict, seed: int, out: Path, progress: bool) -> dict:
    """SFT -> SFT + GRPO (with its blind and single-frame baselines); SFT -> as many seconds of more SFT."""
    from embodied.policy.model import load, save_policy

    model, processor = load(cfg.policy)
    check_response_room(cfg, processor, data["train"])
    stage_s = []  # each curriculum stage's seconds, then the mix's
    for i, stage in enumerate(cfg.cosmos.curriculum):
        train = curriculum_examples(data["train"], stage.families)
        done = _sft(model, processor, train, cfg, seed, out / f"stage{i}", progress, steps=stage.steps)
        stage_s.append(done["wall_s"])
    stage_s.append(_sft(model, processor, data["train"], cfg, seed, out / "sft", progress)["wall_s"])
    if cfg.cosmos.keep_weights:
        save_policy(model, processor, out / "sft" / "model")
    sft_model = copy.deepcopy(model)
    sft_eval = bench_eval(model, processor, data["bench"], cfg, predictions=out / "sft_predictions.jsonl")
    row = {"sft": sft_eval, "sft_s": round(sum(stage_s), 1), "sft_stages_s": [round(t, 1) for t in stage_s]}
    if cfg.cosmos.sft_only:
        return row
    if cfg.cosmos.order_credit > 0:  # the same GRPO from the same SFT policy, only the reward differs
        credit = copy.deepcopy(model)
        kw = {"order_credit": cfg.cosmos.order_credit}
        row["credit_s"] = round(
            _grpo(credit, processor, data["train"], cfg, seed, out / "credit", progress, **kw), 1
        )
        row["sft_grpo_credit"] = bench_eval(credit, processor, data["bench"], cfg)
        del credit
    grpo_s = _grpo(model, processor, data["train"], cfg, seed, out / "grpo", progress)
    if cfg.cosmos.keep_weights:
        save_policy(model, processor, out / "grpo" / "model")
    row |= {"sft_grpo": bench_eval(model, processor, data["bench"], cfg), "grpo_s": round(grpo_s, 1)}
    for name, baseline in (("blind", "blind"), ("single_frame", "single-frame")):
        row[name] = bench_eval(model, processor, data["bench"], cfg, baseline)
    return row | _more_sft(
        sft_model, processor, data["train"], data["bench"], cfg, seed, out, progress, grpo_s
    )


def _zero_job(cfg, data: dict, seed: int, out: Path, progress: bool) -> dict:
    """Format-only SFT (never a right answer), then GRPO."""
    from embodied.policy.model import load

    model, processor = load(cfg.policy)
    _sft(
        model,
        processor,
        data["train"],
        cfg,
        seed,
        out / "format",
        progress,
        steps=cfg.cosmos.format_steps,
        targets="format",
    )
    start = bench_eval(model, processor, data["bench"], cfg)
    grpo_s = _grpo(model, processor, data["train"], cfg, seed, out / "grpo", progress)
    return {
        "format": start,
        "grpo_only": bench_eval(model, processor, data["bench"], cfg),
        "grpo_s": round(grpo_s, 1),
    }


def transfer_split(data: dict, scenes: list[str]) -> tuple[list, list]:
    """Training examples whose scene is in `scenes`; benchmark questions of the same families in other
    scenes."""
    train = [e for e in data["train"] if scene(e) in scenes]
    families = {e.record["family"] for e in train}
    test = [e for e in data["bench"] if scene(e) not in scenes and e.record["family"] in families]
    return train, test


def _transfer_job(cfg, data: dict, seed: int, out: Path, progress: bool) -> dict:
    from embodied.policy.model import load

    train, test = transfer_split(data, cfg.cosmos.transfer_scenes)
    if not train or not test:
        raise ValueError(
            f"cosmos.transfer_scenes={cfg.cosmos.transfer_scenes}: {len(train)} training examples in those "
            f"scenes and {len(test)} benchmark questions of their families elsewhere; name scenes of "
            "data.families"
        )
    model, processor = load(cfg.policy)
    _sft(model, processor, train, cfg, seed, out / "sft", progress)
    sft_model = copy.deepcopy(model)
    row = {"sft": bench_eval(model, processor, test, cfg)}
    grpo_s = _grpo(model, processor, train, cfg, seed, out / "grpo", progress)
    row["grpo_s"] = round(grpo_s, 1)
    row["sft_grpo"] = bench_eval(model, processor, test, cfg)
    row |= _more_sft(sft_model, processor, train, test, cfg, seed, out, progress, grpo_s)
    row["scenes"] = sorted({scene(e) for e in test})
    return row


def _more_sft(
    model, processor, train, test, cfg, seed: int, out: Path, progress: bool, seconds: float
) -> dict:
    """The control of a GRPO stage: SFT continued from the same SFT policy on the same examples for the GRPO
    stage's `seconds` (a cosine over 10**6 steps keeps the SFT's peak learning rate), evaluated on `test`."""
    more = _sft(
        model,
        processor,
        train,
        cfg,
        seed + 1000,
        out / "more_sft",
        progress,
        steps=10**6,
        max_seconds=seconds,
    )
    return {
        "more_sft": bench_eval(model, processor, test, cfg),
        "more_sft_steps": more["steps"],
        "more_sft_s": round(more["wall_s"], 1),
    }


def run_job(cfg, out: Path, seed: int, job: str, progress: bool = False) -> dict:
    """One seed's job (`main`, `zero` or `transfer`), or its saved result when the settings match."""
    cfg = dataclasses.replace(cfg, seed=seed)
    key = {"job": job, "seed": seed} | {
        k: dataclasses.asdict(getattr(cfg, k))
        for k in ("policy", "data", "video", "sft", "grpo", "eval", "cosmos")  # eval: bench_eval's budget
    }
    unused = ("seeds", "workers") + (() if job == "main" else ("curriculum",))  # only main runs the stages
    unused += () if job == "main" and cfg.cosmos.keep_weights else ("keep_weights",)  # keyed only when set
    key["cosmos"] = {k: v for k, v in key["cosmos"].items() if k not in unused}
    folder = out / f"seed{seed}" / job
    fn = {"main": _main_job, "zero": _zero_job, "transfer": _transfer_job}[job]

    def compute() -> dict:
        from embodied.train.common import seed_everything

        data = _load_data(cfg, progress)
        seed_everything(seed)
        return fn(cfg, data, seed, folder, progress)

    return reuse_or_run(folder / "result.json", key, compute, f"seed {seed} {job}", cfg.policy)


def _base(cfg, data: dict, out: Path) -> dict:
    from embodied.policy.model import load

    key = {
        "policy": dataclasses.asdict(cfg.policy),
        "bench": dataclasses.asdict(benchmark_config(cfg)),
        "eval": dataclasses.asdict(cfg.eval),
    }

    def compute() -> dict:
        model, processor = load(cfg.policy)
        return bench_eval(model, processor, data["bench"], cfg)

    return reuse_or_run(out / "base" / "result.json", key, compute, "base", cfg.policy)


def _probe(cfg, data: dict, out: Path) -> dict:
    """Linear probes of the base's visual tokens per family group: fitted on up to `cosmos.probe_train`
    training clips, scored on the benchmark (`embodied.eval.probe`)."""
    from embodied.eval.probe import probe_families
    from embodied.policy.model import load

    n = cfg.cosmos.probe_train
    key = {
        "policy": dataclasses.asdict(cfg.policy),
        "data": dataclasses.asdict(cfg.data),
        "bench": dataclasses.asdict(benchmark_config(cfg)),
        "n": n,
    }

    def compute() -> dict:
        model, processor = load(cfg.policy)
        return probe_families(model, processor, data["train"][:n], data["bench"], cfg.video)

    return reuse_or_run(out / "probe" / "result.json", key, compute, "linear probe", cfg.policy)


def run(cfg, out: Path, progress: bool = True) -> dict:
    cc = cfg.cosmos
    t0 = time.perf_counter()
    out = Path(out)
    data = _load_data(cfg, progress)  # generated here, so that workers find both datasets on disk
    base = _base(cfg, data, out)
    probe = _probe(cfg, data, out) if cc.probe_train else {}
    wanted = ["main"] if cc.sft_only else [job for job in JOBS if job != "transfer" or cc.transfer_scenes]
    jobs = [(cfg, out, seed, job) for job in wanted for seed in cc.seeds]  # the longest jobs first
    results = run_jobs(run_job, jobs, cc.workers, (progress,))
    per_seed = {seed: {} for seed in cc.seeds}
    for (_, _, seed, job), res in zip(jobs, results):
        per_seed[seed][job] = res
    return write_outputs(cfg, out, base, probe, per_seed, round(time.perf_counter() - t0, 1))
