"""What differs between model architectures, in one place: an architecture is one small module here.

Every other module asks the architecture of the model or processor it holds (`architecture_of`) instead
of assuming Qwen2.5-VL. An architecture says:

- which `model_type`s it serves and whether the training loops take it (`trains`);
- how a clip becomes the processor's keyword arguments (`media_inputs`): the framework's pixel budget is one
  unit for every architecture, pixels per frame (`video.min_pixels`, `video.max_pixels`, and the whole clip's
  `video.video_max_pixels`), and each architecture converts it to what its processor's `size` means;
- the media parts of a chat message (`media_parts`: a video part, or the frames as images);
- the vision tower's parameter names (`is_vision`), the encoder outputs beside the features that the language
  model reads (`encoder_extras`, e.g. Qwen3-VL's deepstack features), the end-of-turn text and the
  placeholder tokens that only the processor may place;
- the model-side hooks of training: the position ids of a prompt and of the tokens that continue past it
  (`prompt_positions`, `continued_positions`: a GRPO group's completions run after one shared prompt pass)
  and any in-place speed-up of the vision tower (`patch_vision_attention`).

Visual items are counted the same way for every architecture with grids (`visual_items`): each item's
tokens are `t * h * w / merge**2` of its grid, so a row's items are found by consuming its visual tokens,
whether one video is one block of tokens (Qwen2.5-VL) or one block per temporal patch with timestamps
between (Qwen3-VL). A new architecture: a module here defining an `Architecture` subclass instance named
`ARCHITECTURE`, found by discovery, or `register(...)` from outside.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from embodied.registry import Registry
from embodied.video import Clip, VideoConfig, frame_pixel_cap


class Architecture:
    """The Qwen way of doing each thing, overridable: an architecture module overrides what differs.

    The defaults are those of Qwen2-VL and its successors: the `<|im_end|>` turn end and the vision
    placeholders, a 28 px unit, and multimodal rotary positions (M-RoPE: time, height and width axes, from
    the model's own `get_rope_index`). Another position scheme overrides `prompt_positions` and
    `continued_positions`; nothing outside this package builds position ids."""

    name: str = ""
    model_types: tuple[str, ...] = ()
    """`config.json` `model_type`s served by this architecture."""
    processors: tuple[str, ...] = ()
    """Processor class names of this architecture (the processor alone tells its architecture)."""
    trains: bool = False
    """True when SFT, GRPO and expert iteration take this architecture (its batches split by rows, its
    positions continue past a shared prompt)."""
    vision_prefixes: tuple[str, ...] = ("visual.",)
    """Parameter-name parts that mark the vision tower and its merger."""
    encoder_extras: tuple[str, ...] = ()
    """Fields of the vision encoder's output, beside `pooler_output`, that the language model reads: lists
    (one per layer) of per-item feature tuples."""
    end_of_turn: str | None = "<|im_end|>"
    """The text that closes an assistant message (None: the tokenizer's eos token)."""
    placeholders: tuple[str, ...] = (
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    )
    unit: int = 28
    """Pixels per side of one merged visual token (Qwen2.5-VL: 14 px patches merged 2 x 2)."""
    splits_rows: bool = True
    """Its batches carry visual grids, so rows can be picked and repeated (`select_rows`): forced choice and
    GRPO groups need it."""
    videos_as_video: bool = True
    """A video record's clip goes in as one video (False: its frames as that many images)."""

    def for_processor(self, processor) -> Architecture:
        """This architecture as `processor` sizes frames: `unit` from its video processor's patch and merge
        sizes when they differ from the architecture's published ones (a checkpoint of other sizes)."""
        vp = getattr(processor, "video_processor", None)
        patch, merge = getattr(vp, "patch_size", None), getattr(vp, "merge_size", None)
        if not isinstance(patch, int) or not isinstance(merge, int) or patch * merge == self.unit:
            return self
        architecture = copy.copy(self)
        architecture.unit = patch * merge
        return architecture

    def is_vision(self, name: str) -> bool:
        """True for a parameter of the vision tower (or its merger), by its name."""
        dotted = f".{name}"
        return any(f".{p}" in dotted for p in self.vision_prefixes)

    def media_parts(self, record: dict, frames: int = 0) -> list[dict]:
        """The chat-template parts of a record's visual input, in order (`frames`: its clip's frame count,
        needed where a video record's frames go in as images)."""
        if "video" in record and self.videos_as_video:
            return [{"type": "video"}]
        n = frames if "video" in record else len(record.get("images", []))
        return [{"type": "image"} for _ in range(n)]

    def video_inputs(self, clips: Sequence[Clip], video: VideoConfig) -> dict:
        """Processor kwargs for `clips` as videos: `{"videos": ..., "videos_kwargs": {...}}`."""
        raise NotImplementedError

    def image_inputs(self, clips: Sequence[Clip], video: VideoConfig) -> dict:
        """Processor kwargs for the frames of `clips` as images (one list of images per prompt)."""
        cap = frame_pixel_cap(max(len(c.frames) for c in clips), video)
        return {
            "images": [list(c.frames) for c in clips],
            "images_kwargs": {"size": {"shortest_edge": video.min_pixels, "longest_edge": cap}},
        }

    def sized_frames(self, clip: Clip, video: VideoConfig):
        """`(T, 3, H, W)` float frames of `clip` at the size this architecture's reference preprocessing
        (qwen-vl-utils) gives them under the clip's per-frame cap: `reference_size` on the `unit` grid,
        bicubic with antialiasing, values in 0-255 as the processor rescales them."""
        import torch
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as tvf

        frames = torch.from_numpy(clip.frames).permute(0, 3, 1, 2)
        size = self.frame_size(clip, video)
        return tvf.resize(frames, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True).float()

    def seen_clip(self, clip: Clip, video: VideoConfig) -> Clip:
        """`clip` with its frames at the size the model sees them, as uint8 (the clip itself when the
        architecture keeps their size, e.g. 112 px frames on Qwen2.5-VL's 28 px grid)."""
        if self.frame_size(clip, video) == tuple(clip.frames.shape[1:3]):
            return clip
        sized = self.sized_frames(clip, video).clamp(0, 255).round().byte()
        return Clip(sized.permute(0, 2, 3, 1).numpy(), clip.fps)

    def frame_size(self, clip: Clip, video: VideoConfig) -> tuple[int, int]:
        """`(H, W)` of the clip's frames as the model sees them."""
        h, w = clip.frames.shape[1:3]
        return reference_size(h, w, self.unit, video.min_pixels, frame_pixel_cap(len(clip.frames), video))

    def end_text(self, tokenizer) -> str:
        return self.end_of_turn if self.end_of_turn is not None else tokenizer.eos_token

    def placeholder_ids(self, processor) -> list[int]:
        """Tokens that only the processor may place; a sampled one would corrupt the inputs."""
        tok = processor.tokenizer
        names = list(self.placeholders)
        for attr in ("image_token", "video_token"):
            if isinstance(getattr(processor, attr, None), str):
                names.append(getattr(processor, attr))
        ids = {tok.convert_tokens_to_ids(n) for n in names}
        return sorted(i for i in ids if i is not None and i != tok.unk_token_id)

    def prompt_positions(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """`(position_ids, start)` of a forward pass over the left-padded prompts of `batch` alone:
        `position_ids` as `model` takes them, `start (B, 1)` the position of the first token after each
        prompt (what `continued_positions` counts from).

        M-RoPE: `(3, B, L)` ids from the model's `get_rope_index` (a visual token's time, height and width;
        a text token's one position on all three axes); text after the prompt continues at its unpadded
        length plus its rope delta (a visual item takes fewer positions than tokens)."""
        positions, deltas = model.model.get_rope_index(
            batch["input_ids"],
            image_grid_thw=batch.get("image_grid_thw"),
            video_grid_thw=batch.get("video_grid_thw"),
            attention_mask=batch["attention_mask"],
            second_per_grid_ts=batch.get("second_per_grid_ts"),
            mm_token_type_ids=batch["mm_token_type_ids"],
        )
        return positions, batch["attention_mask"].sum(1, keepdim=True) + deltas

    def continued_positions(self, start: torch.Tensor, steps: torch.Tensor | int) -> torch.Tensor:
        """Position ids of tokens that continue past a prompt whose pass was run on its own: each row's
        `start (R, 1)` (from `prompt_positions`) plus `steps` (one step, or `(T,)` of them), as `model`
        takes them. M-RoPE: the same position on all three axes, `(3, R, T)`."""
        return (start + steps).unsqueeze(0).expand(3, -1, -1)

    def patch_vision_attention(self, model) -> int:
        """Make the vision tower of `model` faster in place with bitwise the same numbers (weights, state
        dict and saved files unchanged); returns how many modules changed. None by default."""
        return 0


def reference_size(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """A frame's size on the `factor` grid with its area in [min_pixels, max_pixels], aspect kept: the rule
    of qwen-vl-utils' `smart_resize` (the preprocessing the Qwen models were trained with)."""
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def video_metadata_kwargs(clips: Sequence[Clip]) -> dict:
    """The clips' true sampling (`VideoMetadata`) and no resampling by the processor: without the metadata
    transformers assumes 24 fps (Qwen2.5-VL's temporal positions, Qwen3-VL's timestamps in the prompt)."""
    return {"video_metadata": [c.metadata() for c in clips], "do_sample_frames": False}


def _is_architecture(plugin: object) -> None:
    if not isinstance(plugin, Architecture):
        raise TypeError(f"{plugin!r} is not an Architecture (embodied.policy.architectures)")


REGISTRY = Registry(
    "model architecture",
    __name__,
    lambda module: "ARCHITECTURE" in module.names,
    dashes=True,
    member=lambda module: module.ARCHITECTURE,
    name_of=lambda architecture: architecture.name,
    check=_is_architecture,
)
"""The architectures: the modules here that assign `ARCHITECTURE` (named as their module, dashes for `_`),
found without importing them (`embodied.registry`), then the registered ones."""


def register(architecture: Architecture) -> Architecture:
    """Add an architecture (e.g. from an outside module); its model types and processors resolve to it, here
    and in the worker processes this one spawns."""
    return REGISTRY.register(architecture)


def architectures() -> dict[str, Architecture]:
    """Every known architecture by name (the generic one included)."""
    return REGISTRY.all()


def training_model_types() -> list[str]:
    """The model types that the training loops take, for messages."""
    return sorted(t for f in architectures().values() if f.trains for t in f.model_types)


def for_model_type(model_type: str) -> Architecture:
    """The architecture serving `model_type` (the generic one for any other image-text-to-text model)."""
    for f in architectures().values():
        if model_type in f.model_types:
            return f
    return architectures()["generic"]


def architecture_of(obj) -> Architecture:
    """The architecture of a model (its `config.model_type`), a config, or a processor (its class)."""
    config = getattr(obj, "config", None) if not hasattr(obj, "model_type") else obj
    config = getattr(obj, "module", obj).config if config is None and hasattr(obj, "module") else config
    if config is not None and getattr(config, "model_type", None):
        return for_model_type(config.model_type)
    name = type(obj).__name__
    for f in architectures().values():
        if name in f.processors:
            return f.for_processor(obj)
    generic = architectures()["generic"]
    return generic.for_processor(obj) if hasattr(obj, "tokenizer") else generic


def model_type_of(folder: str | Path) -> str:
    """The `model_type` in a model folder's config.json ('' when it has none)."""
    try:
        return json.loads((Path(folder) / "config.json").read_text()).get("model_type", "")
    except (OSError, ValueError):
        return ""


def check_trainable(model_type: str, where: str, command: str) -> None:
    """Refuse, in one line, a model type the training loops do not take (before any data loads)."""
    if for_model_type(model_type).trains:
        return
    raise ValueError(
        f"{where}: embodied {command} does not train model_type {model_type!r}; the training loops take "
        f"{', '.join(training_model_types())} (any image-text-to-text model can be evaluated: embodied eval)"
    )


def visual_items(batch, grid_key: str, type_id: int) -> list[int]:
    """How many visual items of one kind (`grid_key`: `image_grid_thw` or `video_grid_thw`; tokens of
    `type_id` in `mm_token_type_ids`) each prompt of `batch` holds.

    Items are laid out in the grid in prompt order; item i has `prod(grid[i]) / merge**2` tokens (merge**2 is
    the batch's grid patches per visual token), so each prompt's items are those whose tokens add up to its
    count, whatever text (Qwen3-VL's timestamps) stands between an item's blocks."""
    if "mm_token_type_ids" not in batch:
        raise ValueError(
            "counting visual inputs needs the processor's mm_token_type_ids (transformers >= 5.20)"
        )
    per_row = (batch["mm_token_type_ids"] == type_id).sum(1).tolist()
    patches = batch[grid_key].prod(-1).tolist()
    merge2 = sum(patches) // max(1, sum(per_row))
    counts, item = [], 0
    for tokens in per_row:
        start = item
        while tokens > 0:
            tokens -= patches[item] // merge2
            item += 1
        if tokens:
            raise ValueError(f"{grid_key}: a prompt's visual tokens do not add up to whole items")
        counts.append(item - start)
    return counts


def repeat_encoder_output(output, rows: Sequence[int], group: int, extras: Sequence[str]):
    """The vision encoder's output for a batch whose prompts are each repeated `group` times in a row.

    `output.pooler_output` (and each `extras` field, a list per layer) holds one tensor per item; `rows` is
    how many visual tokens each prompt has. Each prompt's features are repeated `group` times, and the output
    is of the same class, as the language model reads it."""

    def repeat(items) -> tuple[torch.Tensor]:
        per_prompt = torch.cat(list(items)).split(list(rows))
        return (torch.cat([r for r in per_prompt for _ in range(group)]),)

    fields = {"pooler_output": repeat(output.pooler_output)}
    for name in extras:
        value = getattr(output, name, None)
        if value is not None:
            fields[name] = [repeat(layer) for layer in value]
    return type(output)(**fields)
