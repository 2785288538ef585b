"""The hooks of the lmms-eval tasks that `embodied export --format lmms-eval` writes (`lmms_export`): a
question root or an interactive-episode root scored inside lmms-eval by this framework's own parser, metrics
and physics (docs/evaluation.md, "Evaluate with lmms-eval").

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
  `embodied.eval.env_stats.summarize_env` (success, reward terms): the numbers `embodied eval` prints.

Metric names avoid one another as substrings, because lmms-eval's group aggregation matches a group metric
to every subtask metric containing its name: `accuracy_all` and `chance_all` overall, `accuracy_<tier>` and
`chance_<tier>` per tier; `success`, `unparseable`, `reward_<term>` and `simulate_s` for episodes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SETTINGS_FILE = "embodied_task.json"
HOOKS_FILE = "embodied_hooks.py"
MCQ_METRICS = ("accuracy", "chance")
"""Per question family: each overall (`<metric>_all`) and per tier (`<metric>_<tier>`), plus `unparseable`."""
EPISODE_TERMS_SKIPPED = ("reward/success", "reward/unparseable")
"""Reported under their own names (`success`, `unparseable`) rather than as `reward_*` terms."""
FAILED_MARKERS = ("[LMMS_EVAL_REQUEST_FAILED", "[LMMS_EVAL_BUDGET_EXCEEDED]")
"""How lmms-eval's API backends hand over a request that got no answer (after their retries, or past a token
budget): such a document is counted under `failed` and left out of every other figure, as `embodied eval`
lists a failed request and never scores it as a wrong answer."""


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


def mcq_aggregation(metric: str, tier: str | None = None) -> Callable[[list[dict]], float]:
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


def episode_aggregation(metric: str) -> Callable[[list[dict]], float]:
    """lmms-eval aggregation of executed episodes: `embodied.eval.env_stats.summarize_env`'s `success` or
    `unparseable`, the mean of a reward term (`reward/<term>`), or the hook's mean seconds (`seconds`)."""

    def aggregate(rows: list[dict]) -> float:
        from embodied.eval.env_stats import summarize_env

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
