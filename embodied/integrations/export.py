"""`embodied export`: a dataset root (JSONL records + videos, data/FORMAT.md) as parquet for verl or EasyR1.

Our trainer stays the default; this lets the same questions, interactive episodes and rewards train under
verl (`--format verl`, `export.format=verl`) or EasyR1 (`export.format=easyr1`). One parquet file per split
(`<out>/<split>.parquet`), loadable with Hugging Face `datasets.load_dataset("parquet", ...)`, and
`<out>/export.json` saying what was written and the settings the framework must be given.

verl (`verl/utils/dataset/rl_dataset.py`, `RLHFDataset`; the layout of `examples/data_preprocess/geo3k.py`):

- `data_source`: `embodied/<family>` (an episode: `embodied/<task>`; verl groups validation metrics by it);
- `prompt`: chat messages, one user turn whose text is `<video>` (or one `<image>` per image) followed by
  exactly the text our trainer shows (`embodied.questions.format_question`); verl applies the model's chat
  template, which adds the same default system turn;
- `videos`: `[{"video": PATH, "fps", "max_frames", "min_pixels", "max_pixels", "total_pixels"}]`, passed to
  `qwen_vl_utils.fetch_video`: frames at `video.fps`, at most `video.max_frames`, each frame within
  `video.max_pixels` and the clip within `video.video_max_pixels` (qwen-vl-utils counts `total_pixels` per
  2-frame temporal patch, so it is written as half our per-clip budget); `images` likewise for still records;
- `ability`: `physics`; `reward_model`: `{"style": "rule", "ground_truth": RECORD_JSON}`; `extra_info`: split,
  index, id, kind (the question family or interactive task, `schema.kind`), answer letter, interactive.

The ground truth is the whole record as JSON (`ground_truth_json`): the letter for a multiple-choice question
and, for an interactive episode, everything the simulator needs to rebuild and execute it. The reward entry
point (`embodied/integrations/verl_reward.py`) reads it back.

EasyR1 (`verl/utils/dataset.py` there): `prompt` (a string with `<video>` / `<image>`), `answer` (the same
record JSON) and `videos` or `images` (paths). EasyR1 takes fps and pixel budgets from its own config
(`data.video_fps`, `data.min_pixels`, `data.max_pixels`), which `export.json` lists, and one modality per
file: a split mixing video and image-only records is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = ("verl", "easyr1", "lmms-eval")
"""lmms-eval: a task folder instead of parquet (`embodied.integrations.lmms_eval`)."""


@dataclass
class ExportConfig:
    """`embodied export`: `data.root` (a dataset or interactive-episode root) as parquet for another RL
    framework. Frame sampling and pixel budgets come from the `video` section."""

    format: str = "verl"
    """verl | easyr1 | lmms-eval (a task folder for `lmms-eval --include_path`: docs/evaluation.md)."""
    out: str = ""
    """Output folder; empty: `run_dir` (default `runs/export`)."""
    splits: list[str] = field(default_factory=list)
    """Splits to export (empty: every `<split>.jsonl` in `data.root`; lmms-eval: one, default `test`)."""
    media_root: str = ""
    """Written in place of the absolute dataset root in video and image paths (e.g. where the cluster mounts
    the dataset); empty: absolute paths on this machine."""
    name: str = "embodied"
    """lmms-eval: the group's name; its tasks are `<name>_<family or interactive task>`."""
    pixel_multiple: int = 28
    """lmms-eval: sides of a frame resized into the pixel budget are multiples of this (Qwen2/2.5-VL 28,
    Qwen3-VL and Qwen3.5 32); frames already at that size, as the default 112 px frames are, go unchanged."""


def ground_truth_json(record: dict) -> str:
    """The record as compact JSON, keys sorted: the ground truth both frameworks pass to the reward."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def _media(record: dict, root: Path, media_root: str, video) -> tuple[str, list[dict]]:
    """`("video" | "image", items)`: what the trainer shows for `record` (its video if it has one, else its
    images, as `embodied.policy.model.prompt_text` does), with paths and qwen-vl-utils sampling fields."""
    base = media_root.rstrip("/") if media_root else str(root.resolve())
    if "video" in record:
        item = {
            "video": f"{base}/{record['video']}",
            "fps": float(video.fps),
            "max_frames": int(video.max_frames),
            "min_pixels": int(video.min_pixels),
            "max_pixels": int(video.max_pixels),
            "total_pixels": int(video.video_max_pixels // 2),
        }
        return "video", [item]
    cap = {"min_pixels": int(video.min_pixels), "max_pixels": int(video.max_pixels)}
    return "image", [{"image": f"{base}/{p}", **cap} for p in record["images"]]


def verl_row(record: dict, split: str, index: int, root: Path, media_root: str, video) -> dict:
    """One row of verl's multimodal RL dataset for `record` (fields in the module docstring)."""
    from embodied.data.schema import kind as record_kind
    from embodied.envs import is_interactive
    from embodied.questions import format_question

    kind, items = _media(record, root, media_root, video)
    text = format_question(record["question"], record["options"], record.get("instruction"))
    return {
        "data_source": f"embodied/{record_kind(record)}",
        "prompt": [{"role": "user", "content": f"<{kind}>" * len(items) + text}],
        "videos": items if kind == "video" else None,
        "images": items if kind == "image" else None,
        "ability": "physics",
        "reward_model": {"style": "rule", "ground_truth": ground_truth_json(record)},
        "extra_info": {
            "split": split,
            "index": index,
            "id": str(record["id"]),
            "kind": record_kind(record),
            "answer": record["answer"],
            "interactive": is_interactive(record),
        },
    }


def easyr1_row(record: dict, root: Path, media_root: str, video) -> dict:
    """One row of EasyR1's dataset for `record`: `prompt` string, `answer` (the record JSON), paths."""
    from embodied.questions import format_question

    kind, items = _media(record, root, media_root, video)
    text = format_question(record["question"], record["options"], record.get("instruction"))
    return {
        "prompt": f"<{kind}>" * len(items) + text,
        "answer": ground_truth_json(record),
        f"{kind}s": [item[kind] for item in items],
    }


def _table(rows: list[dict], path: Path):
    """A pyarrow table of `rows`, without the media columns no row uses (verl treats a missing column as
    no media; an all-null struct column has no type)."""
    try:
        import pyarrow as pa
    except ImportError as e:
        raise ImportError(
            "embodied export writes parquet through pyarrow: pip install 'embodied[export]' (or pyarrow)"
        ) from e
    used = {k for row in rows for k, v in row.items() if v is not None}
    rows = [{k: v for k, v in row.items() if k in used} for row in rows]
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"{path}: records do not fit one parquet schema ({e})") from e


def export_dataset(
    root: str | Path, out: str | Path, fmt: str, video, splits=(), media_root: str = ""
) -> dict:
    """Write `root`'s splits as `<out>/<split>.parquet` in `fmt` (verl | easyr1) with `video`'s (a
    `VideoConfig`) sampling; returns the summary also written to `<out>/export.json`."""
    import pyarrow.parquet as pq

    from embodied.data import schema
    from embodied.data.load import load_records

    if fmt not in FORMATS or fmt == "lmms-eval":  # lmms-eval: embodied.integrations.lmms_eval
        raise ValueError(f"export.format={fmt!r}; choose one of {list(FORMATS)}")
    root, out = Path(root), Path(out)
    names = list(splits) or sorted(p.stem for p in root.glob("*.jsonl"))
    if not names:
        raise FileNotFoundError(
            f"{root} holds no <split>.jsonl: point data.root at a dataset made by `embodied generate` "
            "(or interactive episodes, env.root)"
        )
    out.mkdir(parents=True, exist_ok=True)
    written, empty = {}, []
    for split in names:
        records = load_records(root, split)  # names the file and line of a bad record
        if not records:  # e.g. n_val=0, or episodes with n_train=0: no file rather than a columnless one
            empty.append(split)
            continue
        if fmt == "verl":
            rows = [verl_row(r, split, i, root, media_root, video) for i, r in enumerate(records)]
        else:
            rows = [easyr1_row(r, root, media_root, video) for r in records]
            kinds = {k for row in rows for k in ("videos", "images") if k in row}
            if len(kinds) > 1:
                raise ValueError(
                    f"{root}/{split}.jsonl mixes video and image-only records; EasyR1 reads one modality per "
                    "file: export them separately (export.format=verl handles both)"
                )
        missing = [p for row in rows for p in _paths(row) if not media_root and not Path(p).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} media files of {root}/{split}.jsonl are missing: {missing[0]}"
            )
        path = out / f"{split}.parquet"
        pq.write_table(_table(rows, path), path)
        kinds = sorted({schema.kind(r) for r in records})
        written[split] = {"path": str(path), "rows": len(rows), "kinds": kinds}
    if not written:
        raise ValueError(f"every split of {root} is empty ({', '.join(empty)}): nothing to export")
    summary = _summary(root, out, fmt, video, written, media_root) | {"empty_splits": empty}
    (out / "export.json").write_text(json.dumps(summary, indent=2))
    return summary


def _paths(row: dict) -> list[str]:
    items = (row.get("videos") or []) + (row.get("images") or [])
    return [i if isinstance(i, str) else i.get("video", i.get("image")) for i in items]


def _summary(root: Path, out: Path, fmt: str, video, written: dict, media_root: str) -> dict:
    """What `export.json` says: the files, and the framework settings that match our sampling."""
    from embodied.video import frame_pixel_cap

    reward = Path(__file__).with_name("verl_reward.py").resolve()
    summary = {
        "format": fmt,
        "source": str(root.resolve()),
        "media_root": media_root or str(root.resolve()),
        "splits": written,
        "video": {"fps": video.fps, "max_frames": video.max_frames, "min_pixels": video.min_pixels},
        "reward_function": str(reward),
    }
    if fmt == "verl":
        summary["verl_overrides"] = [
            f"data.train_files={written.get('train', {}).get('path', out / 'train.parquet')}",
            f"data.val_files={written.get('val', written.get('test', {})).get('path', out / 'val.parquet')}",
            "data.video_key=videos",
            "data.image_key=images",
            f"reward.custom_reward_function.path={reward}",
            "reward.custom_reward_function.name=compute_score",
        ]
    else:
        summary["easyr1_overrides"] = [
            f"data.train_files={out / 'train.parquet'}",
            "data.prompt_key=prompt",
            "data.answer_key=answer",
            f"data.video_fps={video.fps}",
            f"data.min_pixels={video.min_pixels}",
            f"data.max_pixels={frame_pixel_cap(video.max_frames, video)}",
            f"worker.reward.reward_function={reward}:easyr1_compute_score",
        ]
    return summary
