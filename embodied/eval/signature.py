"""What an evaluation's model was shown: its input signature, so that results are compared like with like.

A result's `signature` (written by `embodied eval`) records:

* `media`: `video` (a video record as one clip) or `images` (every clip as its frames, one image each);
* `frames` and `frame_size`: the frame count(s) and `[height, width]` size(s) of the clips shown;
* `pixels`: the pixel budget (`video.min_pixels`, the per-frame cap `frame_pixel_cap`, `video.fps`);
* `prompt`: a short hash of the question format (`embodied.questions.format_question` on a fixed
  question), so a changed instruction is seen;
* `content_hash` and `data_root`: the split's content hash from the dataset's `manifest.json` (the same
  questions give the same hash wherever the folder lives) and where it was read.

`embodied compare` (`embodied.eval.compare`) ranks results only within one content hash and one metric and
names any other field on which a result differs from its neighbours.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

FIELDS = ("media", "frames", "frame_size", "pixels", "prompt")
"""The signature fields `embodied compare` checks between neighbours (the content hash groups them)."""


def prompt_version() -> str:
    """A short hash of the question format: the text `format_question` makes of a fixed MCQ and a fixed
    action question. It changes exactly when the words a model is asked with change."""
    from embodied.questions import format_question

    text = format_question("Q?", ["a", "b"]) + "\n--\n" + format_question("Q?", [])
    return "q-" + hashlib.sha256(text.encode()).hexdigest()[:10]


def split_hash(root: str | Path, split: str) -> str | None:
    """The split's content hash from `root/manifest.json` (`content_hash.splits[split]`), or None when the
    dataset has no manifest (a folder written by hand)."""
    try:
        manifest = json.loads((Path(root) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    hashes = manifest.get("content_hash") or {}
    value = (hashes.get("splits") or {}).get(split)
    return f"{split}:{value[:16]}" if value else None


def _distinct(values: Sequence) -> list:
    return sorted({json.dumps(v) for v in values}, key=lambda s: (len(s), s))


def input_signature(examples: Sequence, video, media: str, root: str | Path, split: str) -> dict:
    """The signature of an evaluation of `examples` (records with their clips) shown as `media` (`video` or
    `images`; for `auto` pass what it resolved to), with `video` the run's `VideoConfig`."""
    from embodied.video import frame_pixel_cap

    lengths = [len(e.clip.frames) for e in examples]
    sizes = [list(e.clip.frames.shape[1:3]) for e in examples]
    videos = any("video" in e.record for e in examples)
    return {
        "media": "video" if media == "video" and videos else "images",
        "frames": [json.loads(x) for x in _distinct(lengths)],
        "frame_size": [json.loads(x) for x in _distinct(sizes)],
        "pixels": {
            "min_pixels": video.min_pixels,
            "frame_cap": sorted({frame_pixel_cap(n, video) for n in lengths}),
            "fps": video.fps,
        },
        "prompt": prompt_version(),
        "content_hash": split_hash(root, split),
        "data_root": str(Path(root).resolve()),
        "split": split,
    }


def differences(a: dict | None, b: dict | None) -> list[str]:
    """The `FIELDS` on which two signatures differ, as `field: a vs b` (a missing signature: one entry)."""
    if not a or not b:
        return [] if a == b else ["signature: recorded vs not recorded" if a else "signature: not recorded"]
    out = []
    for key in FIELDS:
        if a.get(key) != b.get(key):
            out.append(f"{key}: {_short(a.get(key))} vs {_short(b.get(key))}")
    return out


def describe_signature(signature: dict | None) -> str:
    """A signature in a few words: media, frames and their size, pixel cap, prompt format, split."""
    if not signature:
        return "input not recorded"
    frames = "/".join(map(str, signature.get("frames", []))) or "?"
    size = "/".join("x".join(map(str, s)) for s in signature.get("frame_size", [])) or "?"
    cap = "/".join(map(str, (signature.get("pixels") or {}).get("frame_cap", []))) or "?"
    return (
        f"{signature.get('media')}, {frames} frames of {size} px (cap {cap} px per frame), prompt "
        f"{signature.get('prompt')}, split {signature.get('content_hash') or 'without manifest'}"
    )


def _short(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, list) and len(value) == 1:
        return _short(value[0]) if not isinstance(value[0], int) else str(value[0])
    return str(value)
