"""Any other image-text-to-text model (LLaVA-OneVision, SmolVLM2, Gemma 3/4, InternVL, GLM-4.1V, ...), for
evaluation: greedy answers with the architecture's own chat template and preprocessing.

Its processor's `size` means different things per architecture (pixel lengths for LLaVA-style processors,
where the framework's pixel areas would upscale a frame to 784 px), so the processor keeps its own sizes:
the frames are sampled at `video.fps` as for every architecture, and sized as the model's authors intended.
A clip goes in as a video where the processor has a video processor, else its frames go in as images. The
training loops refuse these architectures (`check_trainable`): their batches carry no grids to split rows by.
"""

from __future__ import annotations

from collections.abc import Sequence

from embodied.policy.architectures import Architecture, video_metadata_kwargs
from embodied.video import Clip, VideoConfig


class Generic(Architecture):
    name = "generic"
    trains = False
    splits_rows = False
    vision_prefixes = ("visual.", "vision_tower.", "vision_model.", "multi_modal_projector.", "connector.")
    end_of_turn = None
    placeholders = ()

    def __init__(self, videos_as_video: bool = True):
        self.videos_as_video = videos_as_video

    def for_processor(self, processor) -> Generic:  # its processor keeps its own sizes: no unit
        """This architecture as `processor` takes it: videos as videos only where it has a video processor."""
        has_video = getattr(processor, "video_processor", None) is not None
        return self if has_video == self.videos_as_video else Generic(videos_as_video=has_video)

    def video_inputs(self, clips: Sequence[Clip], video: VideoConfig) -> dict:
        return {"videos": [c.frames for c in clips], "videos_kwargs": video_metadata_kwargs(clips)}

    def image_inputs(self, clips: Sequence[Clip], video: VideoConfig) -> dict:
        return {"images": [list(c.frames) for c in clips]}


ARCHITECTURE = Generic()
