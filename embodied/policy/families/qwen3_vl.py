"""Qwen3-VL, Qwen3.5 (natively multimodal, with linear-attention layers) and their MoE variants;
Cosmos-Reason2 is a Qwen3-VL checkpoint.

What differs from Qwen2.5-VL: 16 px patches merged 2 x 2 (a 32 px unit); deepstack features from several
vision layers fed to the first language-model layers (`encoder_extras`); one block of video tokens per
temporal patch, with that patch's time written into the prompt between blocks (`<0.2 seconds>`); and a
video processor that reads `size["longest_edge"]` as the whole clip's pixel budget, not a frame's.

So the frames are sized here as the family's reference preprocessing (qwen-vl-utils' `fetch_video`) sizes
them, each frame within the framework's per-frame budget on the 32 px grid, and the processor is told not
to resize again (`do_resize=False`, as Qwen's own examples do after qwen-vl-utils). The timestamps come
from the clip's `VideoMetadata`: the sampled frames' times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from embodied.policy.families import Family, video_metadata_kwargs
from embodied.video import Clip, VideoConfig, frame_pixel_cap

UNIT = 32
"""Pixels per side of one merged visual token: 16 px patches, 2 x 2 merge."""


def reference_size(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """A frame's size on the `factor` grid with its area in [min_pixels, max_pixels], aspect kept: the rule
    of qwen-vl-utils' `smart_resize` (the reference these families were trained with)."""
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def sized_frames(clip: Clip, video: VideoConfig, factor: int = UNIT) -> torch.Tensor:
    """`(T, 3, H, W)` float frames of `clip` resized (bicubic, antialiased) to `reference_size` under the
    clip's per-frame cap, in 0-255 as the processor rescales them."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as tvf

    frames = torch.from_numpy(clip.frames).permute(0, 3, 1, 2)
    cap = frame_pixel_cap(len(clip.frames), video)
    size = reference_size(frames.shape[-2], frames.shape[-1], factor, video.min_pixels, cap)
    return tvf.resize(frames, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True).float()


class Qwen3VL(Family):
    name = "qwen3-vl"
    model_types = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
    processors = ("Qwen3VLProcessor",)
    trains = True
    encoder_extras = ("deepstack_features",)

    def video_inputs(self, clips: Sequence[Clip], video: VideoConfig) -> dict:
        kwargs = video_metadata_kwargs(clips) | {"do_resize": False}
        return {"videos": [sized_frames(c, video) for c in clips], "videos_kwargs": kwargs}


FAMILY = Qwen3VL()
