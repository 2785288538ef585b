"""`embodied export --format lmms-eval`: writes the task folder that `embodied.integrations.lmms_eval`
describes (task and group YAML, documents, settings, the hooks file) for a question or episode root."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import yaml

from embodied.integrations.lmms_eval import (
    EPISODE_TERMS_SKIPPED,
    HOOKS_FILE,
    MCQ_METRICS,
    SETTINGS_FILE,
    TaskSettings,
)


class _Function(str):
    """A YAML `!function module.name` scalar (lmms-eval's loader imports it from beside the YAML)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Function, lambda d, v: d.represent_scalar("!function", str(v)))


def _hook(name: str) -> _Function:
    return _Function(f"{Path(HOOKS_FILE).stem}.{name}")


def metric_names(records: list[dict]) -> list[str]:
    """The metrics of one task's records: per tier for questions, per reward term for episodes."""
    from embodied.envs import is_interactive, task
    from embodied.eval.stats import NO_TIER, TIER_ORDER

    if is_interactive(records[0]):
        terms = ["reward/total", "reward/format", *task(records[0]["task"]).WEIGHTS]
        terms = [t for t in dict.fromkeys(terms) if t not in EPISODE_TERMS_SKIPPED]
        rewards = [t.replace("reward/", "reward_") for t in terms]
        return ["success", "unparseable", *rewards, "simulate_s", "failed"]
    tiers = {r.get("meta", {}).get("difficulty") or NO_TIER for r in records}
    order = {t: (TIER_ORDER.index(t) if t in TIER_ORDER else len(TIER_ORDER), t) for t in tiers}
    tiers = sorted(tiers, key=order.get)  # as embodied eval's tables order them
    names = [f"{m}_all" for m in MCQ_METRICS] + ["unparseable", "failed"]
    return names + [f"{m}_{t}" for t in tiers for m in MCQ_METRICS]


def aggregation_hook(name: str, interactive: bool) -> tuple[str, str]:
    """`(function name, its definition)` in `embodied_hooks.py` of metric `name`'s aggregation."""
    if interactive:
        what = {
            "simulate_s": "seconds",
            "success": "success",
            "unparseable": "unparseable",
            "failed": "failed",
        }
        what = what.get(name)
        what = what or "reward/" + name[len("reward_") :]
        return f"episode_{name}", f"episode_{name} = _hooks.episode_aggregation({what!r})"
    metric, _, tier = name.partition("_")
    args = repr(metric) + ("" if tier in ("", "all") else f", {tier!r}")
    return f"question_{name}", f"question_{name} = _hooks.mcq_aggregation({args})"


def task_yaml(
    name: str, kind: str, docs: Path, metrics: list[str], interactive: bool, meta: dict, gen: dict
) -> dict:
    """One task's config: documents, hooks, greedy generation, metrics with their aggregations."""
    return {
        "task": f"{name}_{kind}",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(docs)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_visual": _hook("doc_to_visual"),
        "doc_to_text": _hook("doc_to_text"),
        "doc_to_target": "answer",
        "process_results": _hook("process_results"),
        "generation_kwargs": gen,
        "metric_list": [
            {
                "metric": m,
                "aggregation": _hook(aggregation_hook(m, interactive)[0]),
                "higher_is_better": not m.startswith(("unparseable", "chance", "simulate", "failed")),
            }
            for m in metrics
        ],
        "metadata": meta,
    }


def group_yaml(name: str, tasks: list[str], interactive: bool, meta: dict) -> dict:
    """The group over every task: size-weighted means of the overall metrics, as `embodied eval`'s
    overall figures weigh each question (episode) once."""
    overall = (
        ("success", "unparseable", "reward_total", "failed")
        if interactive
        else ("accuracy_all", "chance_all", "unparseable", "failed")
    )
    return {
        "group": name,
        "task": tasks,
        "aggregate_metric_list": [
            {"metric": m, "aggregation": "mean", "weight_by_size": True} for m in overall
        ],
        "metadata": meta,
    }


def hooks_source(hooks: dict[str, str]) -> str:
    """`embodied_hooks.py`: the hooks bound to this folder's settings, one line per aggregation."""
    lines = [
        '"""lmms-eval hooks of the tasks beside this file, written by `embodied export --format lmms-eval`.',
        "",
        "The code is `embodied.integrations.lmms_eval`; this file binds it to `embodied_task.json` (the",
        'dataset root, frame sampling, pixel budget and physics settings). Regenerate rather than edit."""',
        "",
        "from pathlib import Path",
        "",
        "from embodied.integrations import lmms_eval as _hooks",
        "",
        f"_task = _hooks.ExportedTask(Path(__file__).with_name({SETTINGS_FILE!r}))",
        "doc_to_visual = _task.doc_to_visual",
        "doc_to_text = _task.doc_to_text",
        "process_results = _task.process_results",
        *(hooks[k] for k in sorted(hooks)),
    ]
    return "\n".join(lines) + "\n"


def _manifest_meta(root: Path) -> dict:
    """The task metadata naming the benchmark generation: the manifest's content hash and generator."""
    path = root / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        digest = manifest["content_hash"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path}: no manifest with a content_hash ({type(e).__name__}); export a root written by "
            "`embodied generate` (or `generate --episodes`), so that a score names its benchmark"
        ) from None
    versions = manifest.get("generator_version", {})
    return {
        "version": 1,
        "content_hash": digest,
        "source": str(root.resolve()),
        "generator": manifest.get("generator", ""),
        "embodied": versions.get("embodied", "") if isinstance(versions, dict) else "",
        "benchmark": bool(manifest.get("benchmark", False)),
    }


def _docs_by_kind(root: Path, split: str, answer: str, media_root: str) -> dict[str, list[dict]]:
    """The split's records by question family or interactive task, episodes in `answer` form (`env.answer`),
    their videos checked (unless they live under `media_root` elsewhere)."""
    from embodied.data.load import load_records
    from embodied.data.schema import kind
    from embodied.envs import answer_form, is_interactive

    records = load_records(root, split)  # names the file and line of a bad record
    if not records:
        raise ValueError(f"{root}/{split}.jsonl is empty: nothing to export")
    missing = [r.get("video", f"{r['id']}: no video") for r in records]
    missing = [m for m in missing if not (root / m).is_file()]
    if missing and not media_root:
        raise FileNotFoundError(f"{len(missing)} videos of {root}/{split}.jsonl are missing: {missing[0]}")
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(kind(r), []).append(answer_form(r, answer) if is_interactive(r) else r)
    return dict(sorted(groups.items()))


def export_lmms_eval(
    root: str | Path,
    out: str | Path,
    video,
    *,
    split: str = "test",
    name: str = "embodied",
    media_root: str = "",
    max_new_tokens: int = 48,
    answer: str = "number",
    backend: str = "cpu",
    format_weight: float = 0.2,
    pixel_multiple: int = 28,
) -> dict:
    """Write `root`'s `split` as an lmms-eval task folder under `out` (module docstring): frames by `video` (a
    `VideoConfig`), `max_new_tokens` greedy tokens an answer (`eval.max_new_tokens`), episodes asked in
    `answer` form and executed on `backend` with `format_weight` (`env.*`). Returns the summary also written
    to `<out>/export.json`."""
    from embodied.envs import is_interactive

    root, out = Path(root), Path(out).resolve()
    if not name.isidentifier():
        raise ValueError(
            f"export.name={name!r}: an lmms-eval task name must be an identifier (e.g. embodied)"
        )
    meta = _manifest_meta(root)
    groups = _docs_by_kind(root, split, answer, media_root)
    (out / "docs").mkdir(parents=True, exist_ok=True)
    gen = {"max_new_tokens": int(max_new_tokens), "temperature": 0, "do_sample": False, "until": []}
    hooks, metrics, tasks = {}, {}, []
    for kind, records in groups.items():
        interactive = is_interactive(records[0])
        docs = out / "docs" / f"{kind}.jsonl"
        docs.write_text("".join(json.dumps(_doc(r, kind, interactive)) + "\n" for r in records))
        metrics[kind] = metric_names(records)
        hooks |= dict(aggregation_hook(m, interactive) for m in metrics[kind])
        config = task_yaml(name, kind, docs, metrics[kind], interactive, meta, gen)
        _write_yaml(out / f"{name}_{kind}.yaml", config)
        tasks.append(config["task"])
    episodes = all(is_interactive(g[0]) for g in groups.values())
    _write_yaml(out / f"{name}.yaml", group_yaml(name, tasks, episodes, meta))
    settings = TaskSettings(
        media_root or str(root.resolve()), video.fps, video.max_frames, video.min_pixels, video.max_pixels,
        video.video_max_pixels, pixel_multiple, backend, format_weight, meta["content_hash"], metrics,
    )  # fmt: skip
    (out / SETTINGS_FILE).write_text(json.dumps(asdict(settings), indent=2))
    (out / HOOKS_FILE).write_text(hooks_source(hooks))
    summary = {
        "format": "lmms-eval",
        "source": str(root.resolve()),
        "split": split,
        "group": name,
        "tasks": {t: len(g) for t, g in zip(tasks, groups.values())},
        "content_hash": meta["content_hash"],
        "command": f"lmms-eval --include_path {out} --tasks {name} --model openai --model_args "
        "model=MODEL,base_url=http://127.0.0.1:8000/v1 --log_samples --output_path OUT",
    }
    (out / "export.json").write_text(json.dumps(summary, indent=2))
    return summary


def _doc(record: dict, kind: str, interactive: bool) -> dict:
    """One lmms-eval document: flat fields for the table, the record itself as JSON."""
    tier = record.get("meta", {}).get("difficulty") or "unspecified"
    return {
        "id": str(record["id"]),
        "kind": kind,
        "tier": str(tier),
        "answer": record["answer"],
        "interactive": interactive,
        "record": json.dumps(record, sort_keys=True),
    }


def _write_yaml(path: Path, config: dict) -> None:
    path.write_text(yaml.dump(config, Dumper=_Dumper, sort_keys=False, width=110))
