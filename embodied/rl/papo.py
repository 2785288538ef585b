"""Masked visual input for PAPO's implicit perception loss, for images and for video.

PAPO (Wang et al. 2025, Sec. 3.2) blackens random patches of the image, aligned to the vision encoder's
patch grid, with probability 0.6 each. Here the same works on video: the processor's flattened patches
`pixel_values_videos` `(N, C * Tp * P * P)` hold, for every video, `t * h * w` rows in the order
(temporal patch, then spatial position), where `video_grid_thw[i] = (t, h, w)` and `Tp` (2 on Qwen2-VL)
frames share one temporal patch. A row is one patch, so masking rows is masking whole patches, and
"per frame" means per temporal patch, the finest unit the encoder sees. `consistent=True` blackens the
same spatial positions in every temporal patch (an object hidden at one place stays hidden); `False`
draws each temporal patch's positions anew. Black is the normalised value of a zero pixel,
(0 - mean) / std per channel, so a masked patch looks exactly like a black region of the frame.
"""

from __future__ import annotations

import torch

from embodied.policy.model import select_rows
from embodied.policy.sampling import Draw, HFEngine, Prompts
from embodied.rl.rewards import score
from embodied.rl.rollout import Rollout


def black_value(processor, video: bool = True) -> torch.Tensor:
    """`(C,)` the normalised value of a black pixel under the processor's mean and std."""
    proc = processor.video_processor if video else processor.image_processor
    mean = torch.tensor(proc.image_mean, dtype=torch.float32)
    std = torch.tensor(proc.image_std, dtype=torch.float32)
    return -mean / std


def patch_mask(
    grid_thw: torch.Tensor, prob: float, consistent: bool, generator: torch.Generator | None = None
) -> torch.Tensor:
    """`(N,)` bool over the flattened patches of every video/image in `grid_thw` `(V, 3)`: True = blacken.

    Each patch is drawn independently with probability `prob`; with `consistent`, one draw per spatial
    position is shared by all of that video's temporal patches.
    """
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"mask probability must be in [0, 1], got {prob}")
    parts = []
    for t, h, w in grid_thw.tolist():
        n = h * w if consistent else t * h * w
        draw = torch.rand(n, generator=generator) < prob
        parts.append(draw.repeat(t) if consistent else draw)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)


def mask_patches(pixel_values: torch.Tensor, mask: torch.Tensor, black: torch.Tensor) -> torch.Tensor:
    """Copy of `pixel_values` `(N, C * Tp * P * P)` with the rows where `mask` `(N,)` is True set to black.

    `black` `(C,)` is repeated over each channel's Tp * P * P values, the processor's row layout.
    """
    channels = black.numel()
    if pixel_values.shape[1] % channels:
        raise ValueError(f"patch rows of width {pixel_values.shape[1]} do not split into {channels} channels")
    row = black.to(pixel_values).repeat_interleave(pixel_values.shape[1] // channels)
    return torch.where(mask.to(pixel_values.device).unsqueeze(1), row, pixel_values)


def masked_batch(batch: dict, processor, prob: float, consistent: bool, generator=None) -> dict:
    """The prompt `batch` with its visual patches randomly blackened (videos and images alike)."""
    out = dict(batch)
    for pix, grid, video in (
        ("pixel_values_videos", "video_grid_thw", True),
        ("pixel_values", "image_grid_thw", False),
    ):
        if pix in batch:
            m = patch_mask(batch[grid].cpu(), prob, consistent, generator)
            out[pix] = mask_patches(batch[pix], m, black_value(processor, video))
    return out


@torch.no_grad()
def masked_input_accuracy(model, processor, ro: Rollout, cfg, reward_fn, gen) -> dict[str, float]:
    """Greedy answers to this step's prompts with real and with masked visual input, scored by `reward_fn`:
    a policy that truly looks should lose accuracy when it cannot see. The trained model answers (the Hugging
    Face engine), whatever `rollout.engine` samples: masked pixel values are the trainer's own batch."""
    G, p = ro.group_size, cfg.papo
    engine = HFEngine(model, processor)
    prompts = select_rows(ro.batch, list(range(0, len(ro.examples) * G, G)))
    records = [e.record for e in ro.examples]
    out = {}
    for name, batch in (
        ("real", prompts),
        ("masked", masked_batch(prompts, processor, p.mask_prob, p.consistent, gen)),
    ):
        texts = engine.sample(Prompts(batch), Draw(cfg.max_new_tokens)).texts
        terms = score(reward_fn, texts, records, cfg.reward_timeout_s)
        key = "reward/accuracy" if "reward/accuracy" in terms[0] else "reward/total"
        out[f"papo/accuracy_{name}"] = sum(t[key] for t in terms) / len(terms)
    return out
