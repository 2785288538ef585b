"""Video in and out: frame sampling at a fixed rate, decoding files, and honest `video_metadata`.

Every clip that reaches the policy is a `Clip`: the sampled frames plus the rate they were sampled at.
The processor always receives that rate as `VideoMetadata`; without it transformers assumes 24 fps and
silently compresses the temporal M-RoPE positions (`second_per_grid_ts` 0.083 instead of 1.0 at 2 fps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np


class VideoError(RuntimeError):
    """A video file that is missing, unreadable or empty. The message names the file and the fix."""


@dataclass
class Clip:
    """Frames `(T, H, W, 3)` uint8 sampled at `fps` frames per second (the rate between frames)."""

    frames: np.ndarray
    fps: float

    def __post_init__(self) -> None:
        f = self.frames
        if f.ndim != 4 or f.shape[-1] != 3 or f.dtype != np.uint8:
            raise ValueError(f"Clip frames must be (T, H, W, 3) uint8, got {f.shape} {f.dtype}")
        if not self.fps > 0:
            raise ValueError(f"Clip fps must be positive, got {self.fps}")

    @property
    def timestamps(self) -> np.ndarray:
        return np.arange(len(self.frames)) / self.fps

    def metadata(self):
        """`VideoMetadata` that makes transformers compute `second_per_grid_ts = temporal_patch / fps`."""
        from transformers.video_utils import VideoMetadata

        n, h, w = self.frames.shape[:3]
        return VideoMetadata(
            total_num_frames=n,
            fps=float(self.fps),
            width=w,
            height=h,
            duration=n / self.fps,
            frames_indices=list(range(n)),
        )


def sample_indices(
    total_frames: int, src_fps: float, fps: float = 2.0, max_frames: int = 32
) -> tuple[list[int], float]:
    """Indices of the frames to keep when sampling `total_frames` at `src_fps` down to `fps`.

    Frames are taken at t = 0, 1/fps, 2/fps, ... while t is inside the video. If that gives more than
    `max_frames`, `max_frames` frames are spread evenly over the whole video instead. Returns the
    indices and the effective sampling rate (the rate between consecutive kept frames).
    """
    if total_frames <= 0:
        raise ValueError("cannot sample from a video with no frames")
    if fps <= 0 or src_fps <= 0 or max_frames <= 0:
        raise ValueError(f"fps, src_fps and max_frames must be positive (got {fps}, {src_fps}, {max_frames})")
    duration = total_frames / src_fps
    n = max(1, math.floor(duration * fps + 1e-9))
    if n <= max_frames:
        idx = [min(total_frames - 1, round(i * src_fps / fps)) for i in range(n)]
        return idx, float(fps)
    idx = np.linspace(0, total_frames - 1, max_frames).round().astype(int).tolist()
    if idx[-1] == idx[0]:  # max_frames == 1: a single frame has no spacing; keep the requested rate
        return idx, float(fps)
    return idx, float((max_frames - 1) * src_fps / (idx[-1] - idx[0]))


SMALL_FRAME = 256 * 256
"""Frames of at most this many pixels decode on one thread (simulated 112 x 112 clips of 4 frames:
3.41-3.45 ms a clip against 3.73-3.84 ms with threading, 600 clips alternated on the 2-core CPU,
docs/benchmarks.md); larger ones use FFmpeg's threads."""


def read_video(path: str | Path, fps: float = 2.0, max_frames: int = 32) -> Clip:
    """Decode `path` (mp4, avi, mkv, ... via PyAV) and sample it at `fps`, at most `max_frames` frames.

    A truncated file is used up to its last good frame (when its index comes first, as `write_video`
    writes it; an mp4 whose index sits at the end is unreadable once cut). Raises `VideoError` naming
    the file when it is missing, cannot be opened or holds no decodable frame.
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise VideoError(
            f"{path}: no such video file. Check the dataset root and the record's `video` field."
        )
    # Decoded frames stay in the codec's format; only the sampled ones are converted to RGB, which costs
    # 3-4x the decoding itself (a 2 fps sample of a 30 fps file converts 1 frame in 15).
    frames: list = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoError(f"{path}: has no video stream. Remove it or replace it with a real video.")
            stream = container.streams.video[0]
            if stream.codec_context.width * stream.codec_context.height > SMALL_FRAME:
                stream.thread_type = "AUTO"  # frame- and slice-threaded decoding; same frames, less wall time
            else:  # a small clip decodes faster on one thread than it takes to start and sync several
                stream.thread_count = 1
            src_fps = float(stream.average_rate or stream.guessed_rate or 0) or 30.0
            try:
                for frame in container.decode(stream):
                    frames.append(frame)
            except av.error.FFmpegError:
                if not frames:  # nothing usable; otherwise keep what decoded before the damage
                    raise
    except VideoError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise VideoError(
            f"{path}: cannot decode ({e}). The file is corrupt or not a video; re-encode it "
            "(ffmpeg -i IN -c:v libx264 OUT.mp4) or delete it."
        ) from e
    if not frames:
        raise VideoError(f"{path}: no decodable frames. Re-encode the file or delete it.")
    idx, eff_fps = sample_indices(len(frames), src_fps, fps, max_frames)
    return Clip(np.stack([frames[i].to_ndarray(format="rgb24") for i in idx]), eff_fps)


def write_video(path: str | Path, frames: np.ndarray, fps: float) -> None:
    """Write frames `(T, H, W, 3)` uint8 as H.264 mp4, every frame a keyframe.

    All-intra coding gives forward and reversed clips the same compression pattern per position, so
    codec artifacts cannot reveal the direction of time. The index (moov) goes first (faststart), so a
    truncated copy still decodes up to its last complete frame.
    """
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t, h, w = frames.shape[:3]
    if h % 2 or w % 2:
        raise ValueError(f"H.264 needs even frame sizes, got {w}x{h}")
    with av.open(str(path), mode="w", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv444p"
        stream.codec_context.gop_size = 1
        # One encoder thread: these clips are small (threads cost more than they save, measured 6.4 vs
        # 5.2 ms for 8 frames at 128x128) and the data engine already runs one worker per core.
        stream.codec_context.thread_count = 1
        stream.options = {"crf": "10", "preset": "veryfast", "tune": "stillimage"}
        for img in frames:
            container.mux(
                stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24"))
            )
        container.mux(stream.encode())


def encode_png(frame: np.ndarray) -> bytes:
    """A frame `(H, W, 3)` uint8 as lossless PNG bytes (a served request's image, a report's still)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class VideoConfig:
    """How clips are turned into visual tokens."""

    fps: float = 2.0
    """Frames per second sampled from a video (Cosmos-Reason1 trains at 2 fps)."""
    max_frames: int = 32
    """At most this many frames per clip; longer clips are sampled evenly at a lower rate."""
    min_pixels: int = 28 * 28
    """Smallest frame area after resizing; set explicitly so small frames are never upscaled."""
    max_pixels: int = 112 * 112
    """Largest frame area after resizing. At 112x112 a frame costs 8 visual tokens (14 px patches, 2x2
    merge, 2 frames per temporal patch)."""
    video_max_pixels: int = 32 * 112 * 112
    """Pixel budget for all frames of one clip; the per-frame cap shrinks for long clips."""


def frame_pixel_cap(num_frames: int, cfg: VideoConfig) -> int:
    """Per-frame pixel cap: `max_pixels`, lowered so the whole clip fits `video_max_pixels`."""
    return max(cfg.min_pixels, min(cfg.max_pixels, cfg.video_max_pixels // max(1, num_frames)))
