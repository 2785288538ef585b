"""Questions from footage have one right answer: constructed clips that must be refused (a still scene with
camera noise, a person standing still, a repeated static segment, a near-uniform patch) and ones that must be
kept (a camera panning over a scene with a moving object), through the families and through the whole
`generate --from-videos` path with its per-reason refusal counts."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from embodied.data.build import generate_dataset
from embodied.data.from_videos import motion
from embodied.data.schema import DataConfig
from embodied.questions import Ambiguous, FamilySpec, changed_area
from embodied.questions import spatial_puzzle as sp
from embodied.questions import temporal_puzzle as tp
from embodied.video import write_video

SIZE = 112


def _scene(seed: int, width: int = SIZE) -> np.ndarray:
    """A smooth random scene `(SIZE, width, 3)`: colour blobs like a room, no two places alike."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (SIZE // 8, width // 8, 3), dtype=np.uint8)
    return cv2.resize(coarse, (width, SIZE), interpolation=cv2.INTER_CUBIC)


def _noisy(frames: np.ndarray, seed: int = 0, sigma: float = 3.0) -> np.ndarray:
    """Camera noise on every frame (a few grey levels, as a real sensor and codec add)."""
    noise = np.random.default_rng(seed).normal(0, sigma, frames.shape)
    return np.clip(frames + noise, 0, 255).astype(np.uint8)


def still_scene(n: int) -> np.ndarray:
    return _noisy(np.repeat(_scene(0)[None], n, axis=0))


def person_standing(n: int) -> np.ndarray:
    """A still scene where only a small face-sized region changes (talking, blinking): 4% of the picture."""
    frames = np.repeat(_scene(1)[None], n, axis=0)
    rng = np.random.default_rng(2)
    for t in range(n):
        frames[t, 40:62, 45:67] = rng.integers(0, 256, 3)  # the mouth and eyes change colour every frame
    return _noisy(frames, seed=3)


def panning(n: int, step: int = 12) -> np.ndarray:
    """The camera pans over a wide scene while a bright ball falls across it: most of the picture moves."""
    wide = _scene(4, width=SIZE + n * step)
    frames = np.stack([wide[:, t * step : t * step + SIZE] for t in range(n)])
    for t in range(n):
        y = 8 + t * (SIZE - 30) // max(n - 1, 1)
        cv2.circle(frames[t], (56, y), 9, (255, 255, 255), -1)
    return _noisy(frames, seed=5)


def test_changed_area_counts_the_share_of_visibly_changed_blocks():
    a = _scene(0)
    assert changed_area(a, a) == 0.0
    assert changed_area(a, 255 - a) > 0.9
    b = a.copy()
    b[:56] = 255 - b[:56]  # the top half changes
    assert changed_area(a, b) == pytest.approx(0.5, abs=0.06)
    assert changed_area(a, _noisy(a[None])[0]) == 0.0  # noise alone is no change


def test_moving_area_refuses_a_still_scene_and_a_person_standing_still_keeps_a_pan():
    threshold = DataConfig().min_moving_area
    assert motion(still_scene(8)) < 0.02
    assert motion(person_standing(8)) < 0.1 < threshold
    assert motion(panning(8)) > 0.5 > threshold


def test_temporal_puzzle_refuses_a_repeated_static_segment_and_keeps_a_moving_clip():
    fam = FamilySpec(family="temporal_puzzle")
    moving = panning(6)
    rec, shown = tp.from_frames(moving, 2.0, np.random.default_rng(0), 1, "easy", fam)
    assert tp.verify(rec, shown, moving) and rec["meta"]["segment_change"] >= tp.FOOTAGE_MIN_SEGMENT_CHANGE
    repeated = moving.copy()
    repeated[4:6] = repeated[0:2]  # the scene comes back to where it started: segments 1 and 3 alike
    with pytest.raises(Ambiguous) as refused:
        tp.from_frames(_noisy(repeated), 2.0, np.random.default_rng(0), 1, "easy", fam)
    assert refused.value.reason == "look_alike_segments"
    for clip in (still_scene(8), person_standing(8)):
        with pytest.raises(Ambiguous, match="swapping them would play the same video"):
            tp.from_frames(clip, 2.0, np.random.default_rng(0), 0, "hard", fam)


@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_spatial_puzzle_refuses_near_uniform_patches_and_uses_a_textured_frame(tier):
    fam = FamilySpec(family="spatial_puzzle")
    wall = _scene(6)
    wall[:, :56] = (180, 120, 60)  # the left half is a plain wooden wall
    frames = _noisy(np.repeat(wall[None], 4, axis=0))
    assert sp.flattest_patch(frames[0], sp.GRID[tier]) < sp.FOOTAGE_MIN_PATCH_STD
    with pytest.raises(Ambiguous) as refused:
        sp.from_frames(frames, 2.0, np.random.default_rng(0), 0, tier, fam)
    assert refused.value.reason == "uniform_patches"
    frames[2] = _noisy(_scene(7)[None])[0]  # one frame of the window shows a textured scene
    rec, still = sp.from_frames(frames, 2.0, np.random.default_rng(0), 3, tier, fam)
    assert rec["meta"]["frame_index"] == 2 and rec["answer"] == "D" and sp.verify(rec, frames[2])


def test_from_videos_counts_refusals_per_family_and_reason(tmp_path):
    videos = tmp_path / "videos"
    for name, clip in (("still.mp4", still_scene(8)), ("standing.mp4", person_standing(8))):
        write_video(videos / name, clip, fps=2.0)
    write_video(videos / "pan.mp4", panning(8), fps=2.0)
    root = tmp_path / "data"
    manifest = generate_dataset(
        DataConfig(root=str(root), from_videos=str(videos), sheets=False), progress=False
    )
    fv = manifest["from_videos"]
    assert fv["windows"]["total"] == 3 and fv["windows"]["still"] == 2
    assert fv["refused"]["arrow_of_time/still"] == 2 and fv["refused"]["temporal_puzzle/still"] == 2
    records = [json.loads(line) for line in (root / "train.jsonl").read_text().splitlines()]
    by_source = {}
    for r in records:
        by_source.setdefault(r["meta"]["source"], []).append(r["family"])
    assert sorted(by_source["pan.mp4"]) == ["arrow_of_time", "spatial_puzzle", "temporal_puzzle"]
    assert "arrow_of_time" not in by_source.get("still.mp4", []) + by_source.get("standing.mp4", [])
    assert sum(fv["refused"].values()) + len(records) == 3 * 3  # every window x family: made or refused
