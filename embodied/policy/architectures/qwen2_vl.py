"""Qwen2-VL and Qwen2.5-VL: 14 px patches merged 2 x 2 (a 28 px unit), one block of tokens per video.

The video processor reads `size` per frame (`shortest_edge` / `longest_edge` are a frame's smallest and
largest pixel area), with `cap_pixels_per_frame` as qwen-vl-utils does, so the framework's per-frame budget
passes through as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from embodied.policy.architectures import Architecture, video_metadata_kwargs
from embodied.video import Clip, VideoConfig, frame_pixel_cap


class Qwen2VL(Architecture):
    name = "qwen2-vl"
    model_types = ("qwen2_vl", "qwen2_5_vl")
    processors = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor")
    trains = True

    def video_inputs(self, clips: Sequence[Clip], video: VideoConfig) -> dict:
        longest = max(len(c.frames) for c in clips)
        kwargs = video_metadata_kwargs(clips)
        kwargs["size"] = {"shortest_edge": video.min_pixels, "longest_edge": frame_pixel_cap(longest, video)}
        return {"videos": [c.frames for c in clips], "videos_kwargs": kwargs}


ARCHITECTURE = Qwen2VL()
