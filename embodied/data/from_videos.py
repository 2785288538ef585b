"""Questions from a folder of user videos: every family that defines `from_frames` (arrow of time, spatial and
temporal puzzles) makes them from real footage.

Each video is decoded once, sampled at `clip.fps`, centre-cropped to the dataset's aspect ratio and resized
to `width x height`. It is cut into non-overlapping windows as long as the longest clip a family needs;
every window gives one record per family, tiers taking turns. A family refuses a window it cannot make a
question with exactly one right answer from, and the manifest counts refusals per family and reason:
families that declare `NEEDS_MOTION` (arrow of time, temporal puzzles) refuse still windows, where less than
`min_moving_area` of the picture changes visibly from frame to frame (a still scene, a person standing
still: no arrow of time, no order); temporal puzzles refuse look-alike segments and spatial puzzles
near-uniform patches (see the families). A family says how many frames one question takes
(`footage_frames`).

Unreadable or corrupt files are skipped, counted and listed in the manifest; a truncated file is used up
to its last good frame and flagged (in the manifest and in each of its records' `meta.truncated`).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path

import numpy as np

from embodied.data.engine import Made, Source, store
from embodied.data.schema import DataConfig
from embodied.questions import (
    FAMILIES,
    TIERS,
    Ambiguous,
    FamilySpec,
    changed_area,
    family,
    family_names,
    hook,
)
from embodied.video import VideoError

VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".wmv", ".flv", ".gif")


def footage_families(names: tuple[str, ...] | None = None) -> list[str]:
    """The families among `names` (default: every known one) that make questions from footage: those that
    define `from_frames`."""
    return [n for n in (family_names() if names is None else names) if hook(family(n), "from_frames")]


def _resize(img: np.ndarray, width: int, height: int) -> np.ndarray:
    """Centre crop to the aspect ratio `width:height`, then area-resize: no stretching."""
    import cv2

    h, w = img.shape[:2]
    if w * height > h * width:  # too wide
        cw = h * width // height
        img = img[:, (w - cw) // 2 : (w - cw) // 2 + cw]
    else:
        ch = w * height // width
        img = img[(h - ch) // 2 : (h - ch) // 2 + ch]
    return cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA)


def decode(path: Path, fps: float, width: int, height: int) -> tuple[np.ndarray, bool]:
    """Frames `(T, height, width, 3)` at `fps` (t = 0, 1/fps, ...) and whether the file is truncated.

    Frames are picked by timestamp while decoding, so a long video never sits in memory whole. Truncated
    means decoding failed after some frames, or fewer frames decoded than the container announces.
    Raises `VideoError` naming the file when nothing can be decoded."""
    import av

    out: list[np.ndarray] = []
    truncated = False
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoError(f"{path}: has no video stream")
            stream = container.streams.video[0]
            announced, n = stream.frames or 0, 0
            try:
                for frame in container.decode(stream):
                    n += 1
                    t = frame.time if frame.time is not None else (n - 1) / float(stream.average_rate or 30)
                    if t + 1e-6 >= len(out) / fps:
                        out.append(_resize(frame.to_ndarray(format="rgb24"), width, height))
            except av.error.FFmpegError:
                if not out:
                    raise
                truncated = True
            truncated = truncated or (announced > 0 and n < announced)
    except VideoError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise VideoError(f"{path}: cannot decode ({e})") from e
    if not out:
        raise VideoError(f"{path}: no decodable frames")
    return np.stack(out), truncated


def motion(frames: np.ndarray) -> float:
    """Moving area: the share of the picture that changes visibly between consecutive frames
    (`embodied.questions.changed_area`), averaged over the window (0-1)."""
    if len(frames) < 2:
        return 0.0
    return float(np.mean([changed_area(a, b) for a, b in zip(frames[:-1], frames[1:])]))


def window_frames(fams: list[FamilySpec], cfg: DataConfig) -> int:
    """Window length: the longest clip any requested family and tier needs (`footage_frames`)."""
    need = [1]
    for f in fams:
        frames_for = hook(family(f.family), "footage_frames")
        need += [frames_for(t, f, cfg.clip) for t in f.tiers]
    return max(need)


class _Answers:
    """Balanced answer indices per (family, tier) that stay balanced for any prefix: blocks of k, each a
    random permutation, consumed only by records that were made (an ambiguous window takes none)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.queues: dict[tuple[int, str], list[int]] = {}
        self.blocks: dict[tuple[int, str], int] = {}

    def peek(self, fi: int, tier: str, k: int) -> int:
        key = (fi, tier)
        if not self.queues.get(key):
            b = self.blocks.get(key, 0)
            self.blocks[key] = b + 1
            rng = np.random.default_rng([self.seed, fi + 1, TIERS.index(tier), b, 4242])
            self.queues[key] = [int(x) for x in rng.permutation(k)]
        return self.queues[key][0]

    def take(self, fi: int, tier: str) -> None:
        self.queues[(fi, tier)].pop(0)


def _list_videos(folder: Path) -> tuple[list[Path], list[str]]:
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder of videos (data.from_videos / --from-videos)")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    videos = [p for p in files if p.suffix.lower() in VIDEO_EXTENSIONS]
    ignored = [
        f"{p}: not a video file extension ({', '.join(VIDEO_EXTENSIONS)})" for p in files if p not in videos
    ]
    return videos, ignored


def _questions(
    clip: np.ndarray,
    key: list[int],
    fams: list[FamilySpec],
    fps: float,
    answers: _Answers,
    still: bool,
    refused: dict,
) -> list[tuple[dict, np.ndarray]]:
    """One record per family from a window (tiers take turns by window); refusals are counted in `refused`
    as `<family>/<reason>` (`still` for the families that declare `NEEDS_MOTION` when the window is
    `still`)."""
    out = []
    for fi, fam in enumerate(fams):
        tier = fam.tiers[key[-1] % len(fam.tiers)]
        module = family(fam.family)
        rng = np.random.default_rng([*key, fi])
        answer = answers.peek(fi, tier, module.num_options(tier, fam.variant))
        try:
            if still and hook(module, "NEEDS_MOTION"):
                raise Ambiguous("the window is still", "still")
            record, frames = module.from_frames(clip, fps, rng, answer, tier, fam)
        except Ambiguous as e:
            refused[f"{fam.family}/{e.reason}"] = refused.get(f"{fam.family}/{e.reason}", 0) + 1
            continue
        answers.take(fi, tier)
        record["meta"] = {"difficulty": tier, **record["meta"]}
        out.append((record, frames))
    return out


class VideoSource(Source):
    """Records from every window of every readable video in `data.from_videos`, into one split. The engine
    runs it in this process: answers stay balanced over the records made so far, whichever windows a family
    refused before."""

    name = "from_videos"

    def __init__(self, cfg: DataConfig) -> None:
        split = "test" if cfg.benchmark else cfg.from_videos_split  # a benchmark is a test split
        super().__init__(cfg, cfg.root, [split], workers=0, sheets=cfg.sheets)
        fams = cfg.families or [
            FamilySpec(family=t, tiers=["easy", "hard"]) for t in footage_families(FAMILIES)
        ]
        makes = footage_families()
        bad = [f.family for f in fams if f.family not in makes]
        if bad:
            raise ValueError(f"--from-videos makes {makes}; {bad} need a simulated scene (no from_frames)")
        self.families, self.folder = fams, Path(cfg.from_videos)
        self.n_win, self.answers = window_frames(fams, cfg), _Answers(cfg.seed)
        self.made, self.used, self.unreadable, self.truncated, self.ignored = 0, [], [], [], []
        self.windows, self.refused = {"total": 0, "still": 0}, {}

    def jobs(self) -> list[Path]:
        videos, self.ignored = _list_videos(self.folder)
        return videos

    def make(self, path: Path) -> list[Made]:
        """Every window's records of one video; an unreadable file is one `(None, why)`."""
        cfg, split = self.cfg, self.splits[0]
        rel = str(path.relative_to(self.folder))
        try:
            frames, cut = decode(path, cfg.clip.fps, cfg.width, cfg.height)
        except VideoError as e:
            self.unreadable.append(str(e))
            return [(None, str(e))]
        self.used.append(rel)
        if cut:
            self.truncated.append(
                f"{path}: truncated; used up to its last good frame ({len(frames)} frames kept)"
            )
        key = int(hashlib.md5(rel.encode()).hexdigest()[:8], 16)  # shuffles depend on the file's name
        out = []
        for w, start in enumerate(range(0, len(frames) - self.n_win + 1, self.n_win)):
            clip = frames[start : start + self.n_win]
            score = motion(clip)
            still = score < cfg.min_moving_area
            self.windows = {"total": self.windows["total"] + 1, "still": self.windows["still"] + still}
            source = {"source": rel, "window_start_s": start / cfg.clip.fps, "motion": round(score, 3)}
            made = _questions(
                clip, [cfg.seed, key, w], self.families, cfg.clip.fps, self.answers, still, self.refused
            )
            for record, shown in made:
                record["meta"] = record["meta"] | source | {"truncated": cut}
                out.append(store(self.root, f"{split}-{self.made:06d}", split, record, shown, cfg.clip.fps))
                self.made += 1
        return out

    def extra(self) -> dict:
        return {
            "families": [asdict(f) for f in self.families],
            "from_videos": {
                "folder": str(self.folder),
                "used": self.used,
                "unreadable": {"count": len(self.unreadable), "items": self.unreadable},
                "truncated": {"count": len(self.truncated), "items": self.truncated},
                "ignored": self.ignored,
                "windows": self.windows | {"frames": self.n_win, "min_moving_area": self.cfg.min_moving_area},
                "refused": self.refused,
            },
        }
