"""Qwen3-VL, Qwen3.5 (natively multimodal, with linear-attention layers) and their MoE variants;
Cosmos-Reason2 is a Qwen3-VL checkpoint.

What differs from Qwen2.5-VL: 16 px patches merged 2 x 2 (a 32 px unit); deepstack features from several
vision layers fed to the first language-model layers (`encoder_extras`); one block of video tokens per
temporal patch, with that patch's time written into the prompt between blocks (`<0.2 seconds>`); and a
video processor that reads `size["longest_edge"]` as the whole clip's pixel budget, not a frame's.

So the frames are sized here as the reference preprocessing (qwen-vl-utils' `fetch_video`) sizes them,
each frame within the framework's per-frame budget on the 32 px grid, and the processor is told not
to resize again (`do_resize=False`, as Qwen's own examples do after qwen-vl-utils). The timestamps come
from the clip's `VideoMetadata`: the sampled frames' times.
"""

from __future__ import annotations

from collections.abc import Sequence

from embodied.policy.architectures import Architecture, video_metadata_kwargs
from embodied.video import Clip, VideoConfig


class Qwen3VL(Architecture):
    name = "qwen3-vl"
    model_types = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
    processors = ("Qwen3VLProcessor",)
    trains = True
    unit = 32
    encoder_extras = ("deepstack_features",)

    def video_inputs(self, clips: Sequence[Clip], video: VideoConfig) -> dict:
        kwargs = video_metadata_kwargs(clips) | {"do_resize": False}
        return {"videos": [self.sized_frames(c, video) for c in clips], "videos_kwargs": kwargs}


ARCHITECTURE = Qwen3VL()
