"""`embodied export --format lmms-eval`: a question root or an interactive-episode root as an lmms-eval task
folder, scored by this framework's own parser, metrics and physics (docs/evaluation.md, "Evaluate with
lmms-eval").

The folder (`lmms-eval --include_path FOLDER --tasks NAME`) holds:

* one task YAML per question family or interactive task (`<name>_<kind>.yaml`, task `<name>_<kind>`) and a
  group over them (`<name>.yaml`, group `<name>`), each with the manifest's content hash in `metadata`;
* `docs/<kind>.jsonl`, the documents: `id`, `kind`, `tier` and the whole record as JSON (`record`);
* `embodied_task.json`, the settings the hooks use (dataset root, frame sampling, pixel budget, physics);
* `embodied_hooks.py`, the hooks the YAML names, bound to those settings; their code is `ExportedTask` here.

What each hook does:

* `doc_to_visual`: the clip's frames as `embodied eval` samples them (`embodied.video.read_video` at
  `video.fps`, at most `video.max_frames`), one PIL image per frame, resized only where they lie outside the
  pixel budget (`budget_frames`). Images, not one video, for every model: what `embodied eval eval.endpoint=`
  sends by default (`eval.media=auto`), since `transformers serve` rejects a `video_url` for Qwen models and
  lmms-eval's OpenAI backend would otherwise re-sample a video path with its own fps and frame count.
* `doc_to_text`: `embodied.questions.format_question` of the record (in `env.answer`'s form for episodes).
* `process_results`: a question's answer read by `embodied.questions.chosen_option` (the accuracy reward's
  reading); an episode's answer executed in MuJoCo by `embodied.envs.reward.env_reward` (its task's
  `parse_action`, `job` and `outcome`), in the harness's process, timed.
* the aggregations: `embodied.eval.stats.prediction_stats` (accuracy, chance, unparseable, per tier) and
  `embodied.eval.envs.summarize_env` (success, reward terms): the numbers `embodied eval` prints.

Metric names avoid one another as substrings, because lmms-eval's group aggregation matches a group metric
to every subtask metric containing its name: `accuracy_all` and `chance_all` overall, `accuracy_<tier>` and
`chance_<tier>` per tier; `success`, `unparseable`, `reward_<term>` and `simulate_s` for episodes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import yaml

SETTINGS_FILE = "embodied_task.json"
HOOKS_FILE = "embodied_hooks.py"
MCQ_METRICS = ("accuracy", "chance")
"""Per question family: each overall (`<metric>_all`) and per tier (`<metric>_<tier>`), plus `unparseable`."""
EPISODE_TERMS_SKIPPED = ("reward/success", "reward/unparseable")
FAILED_MARKERS = ("[LMMS_EVAL_REQUEST_FAILED", "[LMMS_EVAL_BUDGET_EXCEEDED]")
"""How lmms-eval's API backends hand over a request that got no answer (after their retries, or past a token
budget): such a document is counted under `failed` and left out of every other figure, as `embodied eval`
lists a failed request and never scores it as a wrong answer."""
"""Reported under their own names (`success`, `unparseable`) rather than as `reward_*` terms."""


@dataclass
class TaskSettings:
    """What the hooks need besides a document (written to `embodied_task.json`)."""

    root: str
    """The dataset root that the records' relative `video` paths start from (or `export.media_root`)."""
    fps: float
    max_frames: int
    min_pixels: int
    max_pixels: int
    video_max_pixels: int
    pixel_multiple: int = 28
    """Sides of a resized frame are multiples of this (Qwen2/2.5-VL 28; Qwen3-VL and Qwen3.5 32)."""
    backend: str = "cpu"
    """Physics backend of episode outcomes (`env.backend`)."""
    format_weight: float = 0.2
    """Weight of `reward/format` in an episode's `reward/total` (`env.format_weight`)."""
    content_hash: str = ""
    metrics: dict[str, list[str]] | None = None
    """Each task's metric names by question family or interactive task: what `process_results` returns."""


def budget_size(height: int, width: int, n_frames: int, s: TaskSettings) -> tuple[int, int]:
    """The size `embodied eval` has a Qwen processor give a frame of a clip of `n_frames`: `smart_resize` to
    sides that are multiples of `s.pixel_multiple`, the area within `video.min_pixels` and the per-frame cap
    (`embodied.video.frame_pixel_cap`). The formula is qwen-vl-utils' and transformers' `smart_resize`."""
    import math

    from embodied.video import VideoConfig, frame_pixel_cap

    cfg = VideoConfig(s.fps, s.max_frames, s.min_pixels, s.max_pixels, s.video_max_pixels)
    f, lo, hi = s.pixel_multiple, s.min_pixels, frame_pixel_cap(n_frames, cfg)
    h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if h * w > hi:
        beta = math.sqrt(height * width / hi)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < lo:
        beta = math.sqrt(lo / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h, w


def budget_frames(frames: np.ndarray, s: TaskSettings) -> np.ndarray:
    """`frames` `(T, H, W, 3)` uint8 at `budget_size`: unchanged when already there (112 px frames, the
    default, are), else resized as transformers' Qwen image processor resizes (bicubic, antialiased,
    torchvision) and rounded back to uint8. lmms-eval's OpenAI backend cannot pass the pixel budget to the
    server as `embodied eval` does (`chat_template_kwargs.processor_kwargs`), so the frames carry it."""
    t, height, width = frames.shape[:3]
    h, w = budget_size(height, width, t, s)
    if (h, w) == (height, width):
        return frames
    import torch
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
    y = F.resize(x, [h, w], interpolation=InterpolationMode.BICUBIC, antialias=True)
    return y.permute(0, 2, 3, 1).contiguous().numpy()


def record_of(doc: dict) -> dict:
    """The record a document carries (its `record` field: the record as JSON)."""
    return json.loads(doc["record"])


class ExportedTask:
    """The hooks of one exported folder, bound to its `embodied_task.json`."""

    def __init__(self, settings_path: str | Path):
        self.settings = TaskSettings(**json.loads(Path(settings_path).read_text()))

    def frames(self, doc: dict) -> np.ndarray:
        """The clip's frames `(T, H, W, 3)` as `embodied eval` samples them, within the pixel budget."""
        from embodied.video import read_video

        s = self.settings
        clip = read_video(Path(s.root) / record_of(doc)["video"], fps=s.fps, max_frames=s.max_frames)
        return budget_frames(clip.frames, s)

    def doc_to_visual(self, doc: dict, lmms_eval_specific_kwargs: dict | None = None) -> list:
        """One PIL image per sampled frame (see the module docstring for why images)."""
        from PIL import Image

        return [Image.fromarray(f) for f in self.frames(doc)]

    def doc_to_text(self, doc: dict, lmms_eval_specific_kwargs: dict | None = None) -> str:
        from embodied.questions import format_question

        r = record_of(doc)
        return format_question(r["question"], r["options"], r.get("instruction"))

    def process_results(self, doc: dict, results: list) -> dict:
        """A question's prediction row, or an episode's executed outcome, under every metric name of its
        task (lmms-eval hands each metric's aggregation the list of these)."""
        text = str(results[0]) if results else ""
        r = record_of(doc)
        if text.startswith(FAILED_MARKERS):
            row = {"id": r["id"], "failed": text}
        else:
            row = self.episode_row(r, text) if doc["interactive"] else question_row(r, text)
        return {name: row for name in self.settings.metrics[doc["kind"]]}

    def episode_row(self, record: dict, text: str) -> dict:
        """`text` executed in MuJoCo for `record` (parse_action -> job -> simulate -> outcome), timed."""
        from embodied.envs.reward import env_reward

        t0 = time.perf_counter()
        terms = env_reward([text], [record], self.settings.backend, self.settings.format_weight)[0]
        seconds = time.perf_counter() - t0
        return {
            "id": record["id"],
            "task": record["task"],
            "response": text,
            "terms": terms,
            "seconds": seconds,
        }


def question_row(record: dict, text: str) -> dict:
    """The prediction row `embodied eval` writes for a greedy answer (`eval_<split>.json`'s `predictions`)."""
    from embodied.data.schema import kind
    from embodied.questions import chosen_option

    return {
        "id": record["id"],
        "family": kind(record),
        "difficulty": record.get("meta", {}).get("difficulty"),
        "n_options": len(record["options"]),
        "view": 0,
        "answer": record["answer"],
        "predicted": chosen_option(text, record["options"]),
        "response": text,
    }


def mcq_aggregation(metric: str, tier: str | None = None):
    """lmms-eval aggregation of prediction rows: `embodied.eval.stats.prediction_stats`'s `metric`
    (accuracy, chance, unparseable) over the answered documents, overall or within `tier` of the (one)
    family; `failed`: the share of documents without an answer."""
    from embodied.eval.stats import prediction_stats

    def aggregate(rows: list[dict]) -> float:
        if metric == "failed":
            return failed_share(rows)
        stats = prediction_stats([r for r in rows if "failed" not in r])
        if tier is not None:
            (tiers,) = stats["per_family_tier"].values()
            stats = tiers.get(tier, {})
        value = stats.get(metric)
        return float("nan") if value is None else float(value)

    aggregate.__name__ = f"{metric}_{tier or 'all'}"
    return aggregate


def episode_aggregation(metric: str):
    """lmms-eval aggregation of executed episodes: `embodied.eval.envs.summarize_env`'s `success` or
    `unparseable`, the mean of a reward term (`reward/<term>`), or the hook's mean seconds (`seconds`)."""

    def aggregate(rows: list[dict]) -> float:
        from embodied.eval.envs import summarize_env

        if metric == "failed":
            return failed_share(rows)
        rows = [r for r in rows if "failed" not in r]
        if not rows:
            return float("nan")
        if metric == "seconds":
            return float(np.mean([r["seconds"] for r in rows]))
        summary = summarize_env(rows)
        return float(summary["terms"].get(metric, 0.0) if metric.startswith("reward/") else summary[metric])

    aggregate.__name__ = metric
    return aggregate


def failed_share(rows: list[dict]) -> float:
    """The share of documents whose request failed (`FAILED_MARKERS`)."""
    return float(np.mean(["failed" in r for r in rows])) if rows else 0.0


# --- writing the task folder ------------------------------------------------------------------------------


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


def task_yaml(name: str, kind: str, docs: Path, metrics: list[str], interactive: bool, meta: dict, gen: dict):
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
