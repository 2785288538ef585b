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
`cosmos.md`, `cosmos.json` and `cosmos.png`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from embodied.experiments.reuse import process_data, reuse_or_run, run_jobs
from embodied.questions import asks_orders

JOBS = ("main", "transfer", "zero")  # longest first
ROWS = ("base", "sft", "sft_grpo", "sft_grpo_credit", "more_sft", "grpo_only", "blind", "single_frame")
TRANSFER_ROWS = ("sft", "sft_grpo", "more_sft")
ROW_NAMES = {
    "chance": "chance",
    "base": "base",
    "sft": "SFT",
    "sft_grpo": "SFT + GRPO",
    "sft_grpo_credit": "SFT + GRPO, partial order credit",
    "more_sft": "SFT + more SFT (GRPO's wall time)",
    "grpo_only": "GRPO alone (format-only start)",
    "blind": "SFT + GRPO, blind",
    "single_frame": "SFT + GRPO, single frame",
}


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


def write_outputs(cfg, out: Path, base: dict, probe: dict, per_seed: dict, wall_s: float | None) -> dict:
    """The table from the jobs' rows (a row that a seed lacks is left out): `cosmos.json`, `.md`, `.png`."""
    result = summarise(base, per_seed, cfg) | {"probe": probe, "wall_s": wall_s}
    (out / "cosmos.json").write_text(json.dumps(result | {"per_seed": per_seed}, indent=1))
    (out / "cosmos.md").write_text(markdown(result))
    plot(result, out / "cosmos.png")
    print(markdown(result))
    return result


def _stat(values: list[float]) -> dict:
    from embodied.eval.stats import seed_interval

    mean, lo, hi = seed_interval(values)
    return {
        "mean": round(mean, 4),
        "ci95": [round(lo, 4), round(hi, 4)],
        "min": min(values),
        "max": max(values),
    }


def _per_family(ev: dict) -> dict:
    """An evaluation's `per_family` (`per_task` in rows saved before issue 23)."""
    from embodied.eval.stats import by_family

    return by_family(ev)[0]


def _per_tier(ev: dict) -> dict:
    from embodied.eval.stats import by_family

    return by_family(ev)[1]


def _family_mean(ev: dict) -> float:
    """Unweighted mean accuracy over families (Cosmos-Reason1's "average" column)."""
    return float(np.mean([v["accuracy"] for v in _per_family(ev).values()]))


def _rows(base: dict, per_seed: dict) -> dict[str, list[dict]]:
    """Each table row's evaluation per seed (base: the same one for every seed)."""
    seeds = list(per_seed)
    job_of = {"grpo_only": "zero"}  # every other row but the base comes from the main job

    def get(row: str, s) -> dict | None:
        return base if row == "base" else per_seed[s].get(job_of.get(row, "main"), {}).get(row)

    rows = {row: [get(row, s) for s in seeds] for row in ROWS}  # a row some seed lacks is left out
    return {row: evs for row, evs in rows.items() if all(e is not None for e in evs)}


def summarise(base: dict, per_seed: dict, cfg) -> dict:
    """Per row and family: mean over seeds with its t-interval; the issue's three targets checked."""
    rows = _rows(base, per_seed)
    families = sorted(_per_family(base))
    table = {
        row: {f: _stat([_per_family(e)[f]["accuracy"] for e in evs]) for f in families}
        | {"average": _stat([_family_mean(e) for e in evs])}
        for row, evs in rows.items()
    }
    tiers = {
        row: {
            f: {t: _stat([_per_tier(e)[f][t]["accuracy"] for e in evs]) for t in _per_tier(base)[f]}
            for f in families
        }
        for row, evs in rows.items()
    }
    chance = {f: _per_family(base)[f]["chance"] for f in families}
    chance["average"] = float(np.mean(list(chance.values())))
    targets = {  # cosmos.sft_only: no GRPO row
        f"{row}_above_chance": {f: table[row][f]["ci95"][0] > chance[f] for f in families}
        for row in ("sft", "sft_grpo")
        if row in rows
    }
    if "sft_grpo" in rows and "more_sft" in rows:
        diff = [_family_mean(a) - _family_mean(b) for a, b in zip(rows["sft_grpo"], rows["more_sft"])]
        targets["grpo_minus_more_sft"] = _stat(diff)
        targets["grpo_beats_more_sft"] = targets["grpo_minus_more_sft"]["ci95"][0] > 0
    if "blind" in rows and "single_frame" in rows:
        targets["baselines_contain_chance"] = {
            b: {f: table[b][f]["ci95"][0] <= chance[f] <= table[b][f]["ci95"][1] for f in families}
            for b in ("blind", "single_frame")
        }
    if "sft_grpo_credit" in rows:  # partial order credit minus exact match, paired by seed
        pairs = list(zip(rows["sft_grpo_credit"], rows["sft_grpo"]))
        targets["credit_minus_exact"] = {
            f: _stat([_per_family(a)[f]["accuracy"] - _per_family(b)[f]["accuracy"] for a, b in pairs])
            for f in families
            if asks_orders(f)  # the families `grpo.order_credit` pays partial credit on
        }
    return {
        "families": families,
        "chance": chance,
        "table": table,
        "tiers": tiers,
        "targets": targets,
        "transfer": _transfer_table(per_seed),
        "timings_s": _timings(per_seed),
        "n_bench": base["n"],
        "seeds": list(per_seed),
        "policy": cfg.policy.path,
        "sft_steps": cfg.sft.steps,
        "curriculum": [dataclasses.asdict(st) for st in cfg.cosmos.curriculum],
        "grpo_steps": cfg.grpo.steps,
    }


def _transfer_table(per_seed: dict) -> dict:
    runs = [r["transfer"] for r in per_seed.values() if "transfer" in r]
    if not runs:
        return {}
    families = sorted(_per_family(runs[0]["sft"]))
    rows = [row for row in TRANSFER_ROWS if all(row in r for r in runs)]  # more_sft: since 2026-11-26
    out = {
        row: {f: _stat([_per_family(r[row])[f]["accuracy"] for r in runs]) for f in families}
        | {"all": _stat([r[row]["accuracy"] for r in runs])}
        for row in rows
    }
    if "more_sft" in rows:  # on the held-out scenes, paired by seed
        out["grpo_minus_more_sft"] = _stat(
            [r["sft_grpo"]["accuracy"] - r["more_sft"]["accuracy"] for r in runs]
        )
    return out | {"scenes": runs[0]["scenes"], "n": runs[0]["sft"]["n"]}


def _timings(per_seed: dict) -> dict:
    keys = {
        "main": ("sft_s", "grpo_s", "credit_s", "more_sft_s", "more_sft_steps"),
        "zero": ("grpo_s",),
        "transfer": ("grpo_s", "more_sft_s", "more_sft_steps"),
    }
    return {
        f"{job}/{k}": [r[job][k] for r in per_seed.values() if job in r]
        for job, ks in keys.items()
        for k in ks
        if any(k in r.get(job, {}) for r in per_seed.values())
    }


def _cell(s: dict) -> str:
    return f"{s['mean']:.3f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]"


def markdown(result: dict) -> str:
    fams = result["families"] + ["average"]
    head = "| row | " + " | ".join(f.replace("_", " ") for f in fams) + " |"
    stages = "".join(  # a stage's families were its `tasks` before issue 23
        f"{c['steps']} on {' + '.join(c.get('families', c.get('tasks', [])))}, then "
        for c in result.get("curriculum", [])
    )
    lines = [
        f"`{result['policy']}`: SFT {stages}{result['sft_steps']} steps on every family; "
        f"{result['grpo_steps']} GRPO steps; "
        "benchmark "
        f"n = {result['n_bench']}; seeds {result['seeds']}; wall {result.get('wall_s') or '-'} s. "
        "Cells: mean over seeds [95% t-interval].",
        "",
        head,
        "|---" * (len(fams) + 1) + "|",
        "| chance | " + " | ".join(f"{result['chance'][f]:.3f}" for f in fams) + " |",
    ]
    for row, cells in result["table"].items():
        lines.append(f"| {ROW_NAMES[row]} | " + " | ".join(_cell(cells[f]) for f in fams) + " |")
    t = result["targets"]
    lines.append("")
    for row in ("sft", "sft_grpo"):
        if f"{row}_above_chance" in t:
            above = [f for f, ok in t[f"{row}_above_chance"].items() if ok]
            lines.append(
                f"- Families whose {ROW_NAMES[row]} interval lies above chance: {len(above)} of "
                f"{len(result['families'])} ({', '.join(above) or 'none'})."
            )
    if "grpo_minus_more_sft" in t:
        d = t["grpo_minus_more_sft"]
        lines.append(
            f"- SFT + GRPO minus continued SFT, family average, paired by seed: {d['mean']:+.3f} "
            f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]: GRPO "
            f"{'beats' if t['grpo_beats_more_sft'] else 'does not beat'} more SFT."
        )
    for b, fams_ok in t.get("baselines_contain_chance", {}).items():
        missing = [f for f, ok in fams_ok.items() if not ok]
        ok = len(fams_ok) - len(missing)
        but = f" (not: {', '.join(missing)})" if missing else ""
        lines.append(f"- {ROW_NAMES[b]}: interval contains chance on {ok} of {len(fams_ok)} families{but}.")
    for f, c in t.get("credit_minus_exact", {}).items():
        lines.append(
            f"- Partial order credit minus exact match on {f}, paired by seed: {c['mean']:+.3f} "
            f"[{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]."
        )
    lines += _tier_lines(result) + _transfer_lines(result["transfer"]) + _probe_lines(result["probe"])
    tm = result["timings_s"]
    lines += ["", "Seconds per seed: " + "; ".join(f"{k} {v}" for k, v in tm.items()) + "."]
    return "\n".join(lines) + "\n"


def _tier_lines(result: dict) -> list[str]:
    shown = [r for r in ("sft", "sft_grpo", "more_sft") if r in result["tiers"]]
    lines = ["", "| family | tier | " + " | ".join(ROW_NAMES[r] for r in shown) + " |"]
    lines.append("|---" * (len(shown) + 2) + "|")
    for f in result["families"]:
        for tier in result["tiers"]["sft"][f]:
            cells = [_cell(result["tiers"][r][f][tier]) for r in shown]
            lines.append(f"| {f} | {tier} | " + " | ".join(cells) + " |")
    return lines


def _transfer_lines(tr: dict) -> list[str]:
    if not tr:
        return []
    fams = [f for f in tr["sft"] if f != "all"] + ["all"]
    lines = [
        "",
        f"Transfer: trained on the other scenes, tested on {', '.join(tr['scenes'])} (n = {tr['n']}).",
        "",
        "| row | " + " | ".join(fams) + " |",
        "|---" * (len(fams) + 1) + "|",
    ]
    for row in TRANSFER_ROWS:
        if row in tr:
            lines.append(f"| {ROW_NAMES[row]} | " + " | ".join(_cell(tr[row][f]) for f in fams) + " |")
    if "grpo_minus_more_sft" in tr:
        d = tr["grpo_minus_more_sft"]
        lines += [
            "",
            f"- Transfer: SFT + GRPO minus continued SFT, paired by seed: {d['mean']:+.3f} "
            f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}].",
        ]
    return lines


def _probe_lines(probe: dict) -> list[str]:
    if not probe:
        return []
    lines = [
        "",
        "Linear probe of the base's visual tokens (answer text from the clip's tokens; fitted on training "
        "clips, scored on the benchmark):",
        "",
        "| family / scene | classes | n test | probe accuracy [95% CI] | majority class |",
        "|---|---|---|---|---|",
    ]
    for group, p in probe.items():
        lo, hi = p["ci95"]
        lines.append(
            f"| {group} | {p['classes']} | {p['n_test']} | {p['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] | "
            f"{p['majority']:.3f} |"
        )
    return lines


def plot(result: dict, path: Path) -> None:
    """Grouped bars: per family, each row's mean over seeds with its interval, and chance as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = result["families"] + ["average"]
    rows = list(result["table"])
    fig, ax = plt.subplots(figsize=(2.2 * len(fams) + 2, 4))
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        cells = [result["table"][row][f] for f in fams]
        x = np.arange(len(fams)) + (i - (len(rows) - 1) / 2) * width
        means = [c["mean"] for c in cells]
        err = [
            [m - c["ci95"][0] for m, c in zip(means, cells)],
            [c["ci95"][1] - m for m, c in zip(means, cells)],
        ]
        ax.bar(x, means, width, yerr=err, capsize=2, label=ROW_NAMES[row], color=f"C{i}")
    for j, f in enumerate(fams):
        ax.hlines(result["chance"][f], j - 0.45, j + 0.45, color="black", ls="--", lw=1)
    ax.set_xticks(range(len(fams)), [f.replace("_", "\n") for f in fams])
    ax.set(
        ylabel="benchmark accuracy",
        ylim=(0, 1.05),
        title="per family: mean over seeds, 95% interval; -- chance",
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
