"""Video loading: sampling a file at `video.fps` with `embodied.video.read_video` vs `qwen_vl_utils`.

For every file (generated mp4s plus the globs in `bench.video_files`) three readers sample the same
file at the same rate, each `bench.video_repeats` times (median wall time counts):

- `embodied`: `read_video(path, fps, max_frames)`, uint8 frames at the file's own size;
- `qwen_reader`: qwen-vl-utils' own video backend (torchcodec > decord > torchvision, its choice), the
  decode-and-sample step of `fetch_video` without the resize: the like-for-like comparison;
- `qwen_fetch_video`: `qwen_vl_utils.fetch_video` as a user calls it (its resize to multiples of 28 and
  float conversion included; `min_pixels` lowered so that small frames are not upscaled).

Throughput is sampled frames per second of wall time.
"""

from __future__ import annotations

import glob
import statistics
import time
from pathlib import Path

import numpy as np

from embodied.video import read_video, write_video


def generated_videos(folder: Path) -> list[Path]:
    """Two synthetic mp4s written by `write_video` (all-intra H.264, as datasets are stored):
    a dataset-sized clip and a larger, longer one. A moving square over a gradient, so frames differ."""
    specs = {"gen_112px_30fps_4s.mp4": (112, 112, 30, 4.0), "gen_640x360_30fps_10s.mp4": (640, 360, 30, 10.0)}
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (w, h, fps, seconds) in specs.items():
        path = folder / name
        if not path.exists():
            n = int(fps * seconds)
            yy, xx = np.mgrid[0:h, 0:w]
            base = np.stack([xx * 255 // w, yy * 255 // h, np.full_like(xx, 96)], -1).astype(np.uint8)
            frames = np.repeat(base[None], n, axis=0)
            side = max(8, h // 6)
            for t in range(n):
                x = int((w - side) * t / max(1, n - 1))
                frames[t, h // 3 : h // 3 + side, x : x + side] = 255
            write_video(path, frames, fps)
        paths.append(path)
    return paths


def _time(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def _qwen_readers(path: Path, fps: float, max_frames: int):
    """Callables for qwen-vl-utils' backend reader and its `fetch_video`, each returning a frame count."""
    from qwen_vl_utils import vision_process as qv

    ele = {"video": str(path), "fps": fps, "max_frames": max_frames, "min_pixels": 28 * 28}

    def reader() -> int:
        video, _, _ = qv.VIDEO_READER_BACKENDS[qv.get_video_reader_backend()](dict(ele))
        return int(video.shape[0])

    def fetch() -> int:
        return int(qv.fetch_video(dict(ele)).shape[0])

    return {"qwen_reader": reader, "qwen_fetch_video": fetch}


def bench_file(path: Path, fps: float, max_frames: int, repeats: int) -> dict:
    """Median seconds and sampled frames per second of each reader on `path`."""
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        info = {
            "file": str(path),
            "size": f"{s.width}x{s.height}",
            "src_fps": round(float(s.average_rate or 0), 3),
            "src_frames": s.frames,
        }
    readers = {"embodied": lambda: len(read_video(path, fps, max_frames).frames)}
    readers |= _qwen_readers(path, fps, max_frames)
    out = {}
    for name, fn in readers.items():
        try:
            fn()  # warm-up: imports, codec initialisation, page cache
            sec, frames = _time(fn, repeats)
            out[name] = {"frames": frames, "seconds": round(sec, 4), "frames_per_s": round(frames / sec, 1)}
        except Exception as e:  # a reader that cannot read the file is a result, not a crash
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    speedups = {
        f"embodied_over_{k}": round(out[k]["seconds"] / out["embodied"]["seconds"], 2)
        for k in ("qwen_reader", "qwen_fetch_video")
        if "seconds" in out.get(k, {}) and "seconds" in out["embodied"]
    }
    return {**info, "readers": out, "speedup": speedups}


def run(cfg, out: Path, progress: bool = True) -> dict:
    """Benchmark every generated and configured video file; returns the JSON-ready result."""
    files = generated_videos(out / "videos")
    for pattern in cfg.bench.video_files:
        files += [Path(p) for p in sorted(glob.glob(pattern))]
    try:
        from qwen_vl_utils import vision_process as qv

        backend = qv.get_video_reader_backend()
    except Exception as e:
        backend = f"unavailable ({type(e).__name__}: {e})"
    results = []
    for path in files:
        r = bench_file(path, cfg.video.fps, cfg.video.max_frames, cfg.bench.video_repeats)
        results.append(r)
        if progress:
            rates = {k: v.get("frames_per_s", v.get("error")) for k, v in r["readers"].items()}
            print(f"{path.name}: frames/s {rates}", flush=True)
    return {
        "benchmark": "video",
        "fps": cfg.video.fps,
        "max_frames": cfg.video.max_frames,
        "repeats": cfg.bench.video_repeats,
        "qwen_vl_utils_backend": backend,
        "files": results,
    }
