"""Perception pretraining: a tiny base policy that sees before any question is asked.

A real run starts from Qwen2.5-VL, which already perceives objects, colours and where things are; a
randomly initialised tiny model does not, and question-answer training alone teaches it the answer format
long before it finds the visual cue (docs/perception.md measures this). The simulator knows everything
about its scenes, so it supervises perception for free: `embodied pretrain` renders drop clips and trains
the whole tiny Qwen2.5-VL (vision tower and language model) to caption them from the ground truth::

    3 objects: red box, blue sphere, green capsule.
    frame 1: red high, blue high, green low. frame 2: red floor, blue low, green floor. ...

The captions (`embodied.questions.caption`) never say which way time runs: the base has never been told an
arrow-of-time answer: reinforcement learning on top of it gets the answer only through its reward. The
clips come from the data engine's workers and stay in memory.

The result is an ordinary Hugging Face folder. `policy.path=tiny-base` (the default) loads the copy shipped
in `embodied/assets/tiny_base`, which `embodied pretrain` rebuilds to within 1e-4 on a 2-core CPU
(tests/test_pretrain.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embodied.data.engine import Source, make_all
from embodied.data.load import Example
from embodied.environment import stamped
from embodied.questions.caption import (
    COLOUR_WORDS,
    OBJECTS_QUESTION,
    QUESTION,
    SCENE_QUESTION,
    colour_index,
    make_clip,
    make_scene_clip,
)
from embodied.video import Clip


@dataclass
class PretrainConfig:
    """`embodied pretrain`: perception captions from the drop world, then SFT of the whole tiny model."""

    out: str = ""
    """Folder of the pretrained policy (empty: `run_dir/model`)."""
    n_clips: int = 2000
    """Training clips (rendered in memory, never written to disk)."""
    n_val: int = 100
    """Held-out clips for the caption accuracy reported at the end."""
    seed: int = 0
    """Seed of the clips (disjoint from every dataset's seeds) and of training."""
    max_start: float = 1.0
    """Clip windows start anywhere in the first `max_start` s after release (later: everything rests)."""
    vision_steps: int = 300
    """Stage 1: steps of the vision tower alone on object occupancy (`pretrain_vision`)."""
    vision_lr: float = 1e-3
    vision_target: str = "occupancy"
    """Stage 1's target per visual token and frame: occupancy (is an object there) | colour (which of the
    caption's colour words is there, one bit each)."""
    steps: int = 250
    """Stage 2: caption SFT steps of the whole model."""
    batch_size: int = 32
    lr: float = 1e-3
    vision_lr_scale: float = 1.0
    warmup_steps: int = 50
    workers: int = 2
    """Processes that simulate and render the clips (0 = this one)."""
    captions: str = "drop"
    """drop: the drop scene's height captions (how `tiny-base` was made) | scene: every scene in `scenes`,
    captioned with where each object is in every frame, whether it is seen, how it stands and whether it
    moves (`questions.caption.make_scene_clip`) | objects: the same clips, captioned with their object
    list alone (`2 objects: purple box, green sphere.`), so every target token is a count, colour or shape."""
    scenes: list[str] = field(default_factory=lambda: ["drop"])
    """Scenes the `scene` captions are drawn from, one per clip, uniformly."""
    num_frames: list[int] = field(default_factory=lambda: [4])
    """Frames per `scene` clip, drawn per clip from this list (at 2 fps)."""
    init: str = ""
    """Continue from this policy (a folder or `tiny-base`) instead of building the tiny model from a seed."""
    tiny: dict = field(default_factory=dict)
    """Sizes of the tiny model built when `init` is empty: `TinySpec` fields (`vision_hidden`,
    `vision_depth`, `text_hidden`, `text_layers`, ...); unnamed ones keep their defaults."""
    architecture: str = "qwen2.5-vl"
    """Architecture of the tiny model built when `init` is empty: qwen2.5-vl (`tiny-base`) | qwen3-vl
    (`tiny-base-qwen3-vl`) | qwen3.5 (`embodied.policy.tiny.TINY_ARCHITECTURES`)."""


# --- clips --------------------------------------------------------------------------------------------


class CaptionClips(Source):
    """Captioned drop clips made by the data engine's workers and kept in memory (never written)."""

    chunksize = 16

    def __init__(self, cfg: PretrainConfig) -> None:
        super().__init__(cfg, root="", splits=[], workers=cfg.workers)

    def make(self, seed: int) -> tuple:
        pc = self.cfg
        if pc.captions == "drop":
            return make_clip(self.world("drop", 112, 112), seed, pc.max_start)
        pick = np.random.default_rng([seed, 1])  # the clip's own stream (make_scene_clip's) stays untouched
        name = pc.scenes[int(pick.integers(len(pc.scenes)))]
        frames = int(pc.num_frames[int(pick.integers(len(pc.num_frames)))])
        difficulty = ("easy", "hard")[int(pick.integers(2))]
        made = make_scene_clip(self.world(name, 112, 112), seed, frames, difficulty=difficulty)
        return made[0], made[1], made[2] | {"scene": name}


def make_examples(
    n: int, seed: int, stream: int, cfg: PretrainConfig, progress: bool = True
) -> list[Example]:
    """`n` captioned clips as `Example`s (record with `target`, clip in memory), from seed stream `stream`."""
    # 9_000 + stream: away from the dataset splits' streams (0-2, 100+ hashed names)
    seeds = np.random.SeedSequence([seed, 9_000 + stream]).generate_state(n, dtype=np.uint64) % (2**63)
    jobs = [int(s) for s in seeds]
    results = list(make_all(CaptionClips(cfg), jobs, cfg.workers, progress, desc="pretrain clips"))
    return [
        Example(
            {
                "id": f"pretrain-{stream}-{i}",
                "family": "caption",
                "video": "",
                "question": {"drop": QUESTION, "objects": OBJECTS_QUESTION}.get(cfg.captions, SCENE_QUESTION),
                "options": [],
                "instruction": "",
                "target": text.split(". ")[0] + "." if cfg.captions == "objects" else text,
                "meta": meta,
            },
            Clip(frames, 2.0),
        )
        for i, (frames, text, meta) in enumerate(results)
    ]


# --- stage 1: the vision tower alone, on where the objects are -----------------------------------------


def occupancy(
    frames: np.ndarray, cell: int = 28, min_share: float = 0.02, colours: bool = False
) -> np.ndarray:
    """`(T // 2 * H/cell * W/cell, 2)` targets, one row per merged visual token in Qwen's raster order
    (temporal patch, row, column): is an object in the token's `cell` x `cell` square in each of the
    temporal patch's two frames. Objects are the saturated pixels (floor, sky and shadows are grey).

    With `colours`, `(..., 2 * len(COLOUR_WORDS))`: for each frame of the pair and each colour word, whether
    that colour's pixels fill the share (hue binned as the captions name it, `embodied.questions.caption`)."""
    rgb = frames.astype(np.float32)
    hi, lo = rgb.max(-1), rgb.min(-1)
    objects = (hi - lo > 0.4 * hi) & (hi > 60)
    t, h, w = objects.shape
    if colours:
        masks = objects[..., None] & (colour_index(rgb)[..., None] == np.arange(len(COLOUR_WORDS)))
    else:
        masks = objects[..., None]
    k = masks.shape[-1]
    share = masks.reshape(t, h // cell, cell, w // cell, cell, k).mean((2, 4)) > min_share
    pairs = share.reshape(t // 2, 2, h // cell, w // cell, k).transpose(0, 2, 3, 1, 4)
    return pairs.reshape(-1, 2 * k).astype(np.float32)


def pretrain_vision(model, processor, examples, pc: PretrainConfig, video, progress: bool = True) -> dict:
    """Train the vision tower (and merger) with a linear head on `occupancy`: a dense loss one layer away
    from the pixels, so the tower learns to see before the language model learns to read it. The head is
    discarded; returns the held-out accuracy of the occupancy bits."""
    import torch
    from tqdm.auto import tqdm  # here: the config (`embodied show-config`) imports this module

    from embodied.policy.architectures import architecture_of
    from embodied.policy.model import encode_prompts
    from embodied.train.common import index_batches

    vis = model.model.visual
    family = architecture_of(model)
    device = next(model.parameters()).device
    colours = pc.vision_target == "colour"
    width = 2 * (len(COLOUR_WORDS) if colours else 1)
    head = torch.nn.Linear(model.config.vision_config.out_hidden_size, width).to(device)
    params = [*vis.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=pc.vision_lr, weight_decay=0.0)
    n_val = min(256, len(examples) // 8)
    train, val = examples[n_val:], examples[:n_val]
    order = index_batches(len(train), pc.batch_size, pc.seed)

    def loss_and_acc(chunk):
        batch = encode_prompts(processor, [e.record for e in chunk], [e.clip for e in chunk], video, device)
        tokens = vis(batch["pixel_values_videos"], grid_thw=batch["video_grid_thw"]).pooler_output
        seen = [family.seen_clip(e.clip, video).frames for e in chunk]  # occupancy of what the model sees
        target = torch.from_numpy(
            np.concatenate([occupancy(f, family.unit, colours=colours) for f in seen])
        ).to(device)
        logits = head(tokens)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        return loss, ((logits > 0).float() == target).float().mean().item(), target.mean().item()

    model.train()
    for _ in tqdm(range(pc.vision_steps), desc="pretrain vision", unit="step", disable=not progress):
        loss, _, _ = loss_and_acc([train[i] for i in next(order)])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        _, acc, base = loss_and_acc(val)
    return {"occupancy_accuracy": round(acc, 4), "occupancy_base_rate": round(base, 4), "n": len(val)}


# --- evaluation ----------------------------------------------------------------------------------------


def caption_accuracy(model, processor, examples, video, batch_size: int = 64) -> dict:
    """Greedy captions of `examples` against the truth: object count, colour/shape list, height words."""
    import torch

    from embodied.policy.model import encode_prompts
    from embodied.policy.sampling import Draw, HFEngine, Prompts

    counts = {"count": 0, "objects": 0, "heights": 0, "heights_total": 0, "exact": 0}
    device = next(model.parameters()).device
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        batch = encode_prompts(processor, [e.record for e in chunk], [e.clip for e in chunk], video, device)
        with torch.no_grad():
            texts = HFEngine(model, processor).sample(Prompts(batch), Draw(160)).texts
        for e, text in zip(chunk, texts):
            truth = e.record["target"]
            head_t, *frames_t = truth.rstrip(".").split(". ")
            head_p, *frames_p = text.rstrip(".").split(". ")
            counts["count"] += head_p.split(" ")[0] == head_t.split(" ")[0]
            counts["objects"] += head_p == head_t
            counts["exact"] += text.strip() == truth
            for ft, fp in zip(frames_t, frames_p + [""] * len(frames_t)):
                wt, wp = ft.split(), fp.split()
                for j in range(3, len(wt), 2):  # "frame k: colour height, colour height"
                    counts["heights"] += j < len(wp) and wp[j].rstrip(",") == wt[j].rstrip(",")
                    counts["heights_total"] += 1
    n = len(examples)
    return {
        "count_accuracy": counts["count"] / n,
        "objects_accuracy": counts["objects"] / n,
        "height_accuracy": counts["heights"] / max(1, counts["heights_total"]),
        "exact_match": counts["exact"] / n,
        "n": n,
    }


def scene_caption_accuracy(model, processor, examples, video, batch_size: int = 32) -> dict:
    """Greedy scene captions against the truth: the object list, and per frame and object the word group
    (`red d5 upright still`), its square and its state words (hidden / out / pose / moving).

    The colour words are scored apart, because the object list's order (geom order) is not always visible:
    `object_colours_accuracy` is the share of clips whose list names the right colours in any order,
    `colour_word_accuracy` the share of word groups whose colour is right, beside `colour_word_majority`, what
    always writing the commonest colour would score."""
    from collections import Counter

    import torch

    from embodied.policy.model import encode_prompts
    from embodied.policy.sampling import Draw, HFEngine, Prompts

    n = {"objects": 0, "groups": 0, "squares": 0, "states": 0, "states_total": 0, "total": 0, "exact": 0}
    n |= {"colour_sets": 0, "shape_sets": 0, "colour_words": 0}
    truth_colours: Counter = Counter()
    device = next(model.parameters()).device
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        batch = encode_prompts(processor, [e.record for e in chunk], [e.clip for e in chunk], video, device)
        with torch.no_grad():
            texts = HFEngine(model, processor).sample(Prompts(batch), Draw(320)).texts
        for e, text in zip(chunk, texts):
            head_t, *frames_t = e.record["target"].rstrip(".").split(". ")
            head_p, *frames_p = text.strip().rstrip(".").split(". ")
            n["objects"] += head_p == head_t
            names_t, names_p = _names(head_t), _names(head_p)
            n["colour_sets"] += sorted(c for c, _ in names_t) == sorted(c for c, _ in names_p)
            n["shape_sets"] += sorted(s for _, s in names_t) == sorted(s for _, s in names_p)
            n["exact"] += text.strip() == e.record["target"]
            for ft, fp in zip(frames_t, frames_p + [""] * len(frames_t)):
                gt, gp = ft.split(": ", 1)[-1].split(", "), fp.split(": ", 1)[-1].split(", ")
                for wt, wp in zip(gt, gp + [""] * len(gt)):
                    wt, wp = wt.split(), wp.split()
                    n["total"] += 1
                    n["groups"] += wt == wp
                    n["colour_words"] += bool(wp) and wp[0] == wt[0]
                    truth_colours[wt[0]] += 1
                    n["squares"] += len(wp) > 1 and wp[1] == wt[1]
                    n["states"] += sum(a == b for a, b in zip(wt[2:], wp[2:]))
                    n["states_total"] += max(0, len(wt) - 2)
    total = max(1, n["total"])
    return {
        "objects_accuracy": n["objects"] / len(examples),
        "object_colours_accuracy": n["colour_sets"] / len(examples),
        "object_shapes_accuracy": n["shape_sets"] / len(examples),
        "colour_word_accuracy": n["colour_words"] / total,
        "colour_word_majority": max(truth_colours.values(), default=0) / total,
        "group_accuracy": n["groups"] / total,
        "square_accuracy": n["squares"] / total,
        "state_word_accuracy": n["states"] / max(1, n["states_total"]),
        "exact_match": n["exact"] / len(examples),
        "n": len(examples),
    }


def _names(head: str) -> list[tuple[str, str]]:
    """`2 objects: purple box, green ball` -> [("purple", "box"), ("green", "ball")] (malformed parts: "")."""
    items = head.split(": ", 1)[-1].split(", ") if ": " in head else []
    return [(w[0] if w else "", w[1] if len(w) > 1 else "") for w in (x.split() for x in items)]


# --- the command ---------------------------------------------------------------------------------------


def pretrain_policy(
    pc: PretrainConfig,
    sft,
    video,
    tiny_seed: int,
    out_dir: Path,
    progress: bool = True,
    device: str = "cpu",
) -> dict:
    """Build the tiny model (`tiny_seed`), caption-pretrain it with the SFT loop (`sft`, an `SFTConfig`),
    save it to `pc.out` (or `out_dir/model`) and return a summary with the held-out caption accuracy."""
    import torch

    from embodied.policy.model import load_policy, resolve_policy_path, save_policy
    from embodied.policy.tiny import TinySpec, build_tiny_policy
    from embodied.train.common import seed_everything
    from embodied.train.sft import train_sft
    from embodied.train.state import Run

    out = Path(pc.out) if pc.out else Path(out_dir) / "model"
    _check(pc)
    t0 = time.perf_counter()
    train = make_examples(pc.n_clips, pc.seed, 0, pc, progress)
    val = make_examples(pc.n_val, pc.seed, 1, pc, progress)
    t_data = time.perf_counter() - t0
    seed_everything(pc.seed)
    spec = TinySpec(**(pc.tiny | {"seed": tiny_seed}))
    start = (
        resolve_policy_path(pc.init)
        if pc.init
        else build_tiny_policy(spec=spec, architecture=pc.architecture)
    )
    model, processor = load_policy(start, device=device)
    t1 = time.perf_counter()
    vision = pretrain_vision(model, processor, train, pc, video, progress) if pc.vision_steps else {}
    t_vision = time.perf_counter() - t1
    run = Run(model, processor, train, out_dir, video, seed=pc.seed, progress=progress)
    info = train_sft(sft, run, target_fn=_target)
    with torch.no_grad():
        score = caption_accuracy if pc.captions == "drop" else scene_caption_accuracy
        acc = score(model, processor, val, video)
    save_policy(model.cpu(), processor, out)
    summary = {
        "pretrain": dataclasses.asdict(pc),
        "tiny_seed": tiny_seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": device,
        "vision_val": vision,
        "caption_val": acc,
        "time_s": {
            "clips": round(t_data, 1),
            "vision": round(t_vision, 1),
            "caption": round(info["wall_s"], 1),
        },
        "threads": torch.get_num_threads(),
    }
    (out / "embodied_pretrain.json").write_text(json.dumps(stamped(summary), indent=2))
    return summary | {"model": str(out)}


def _check(pc: PretrainConfig) -> None:
    from embodied.policy.tiny import TinySpec
    from embodied.worlds import WORLD_NAMES

    sizes = {f.name for f in dataclasses.fields(TinySpec)} - {"seed"}
    if set(pc.tiny) - sizes:
        raise ValueError(
            f"pretrain.tiny: unknown {sorted(set(pc.tiny) - sizes)}; known: {sorted(sizes)} "
            "(the seed is policy.tiny_seed)"
        )
    if pc.tiny and pc.init:
        raise ValueError("pretrain.tiny sizes a model built from scratch; set pretrain.init='' to use it")

    if pc.vision_target not in ("occupancy", "colour"):
        raise ValueError(f"pretrain.vision_target must be 'occupancy' or 'colour', got {pc.vision_target!r}")
    if pc.captions not in ("drop", "scene", "objects"):
        raise ValueError(f"pretrain.captions must be 'drop', 'scene' or 'objects', got {pc.captions!r}")
    unknown = [s for s in pc.scenes if s not in WORLD_NAMES]
    if unknown or not pc.scenes:
        raise ValueError(f"pretrain.scenes: unknown {unknown or 'empty list'}; known: {sorted(WORLD_NAMES)}")
    if not pc.num_frames or any(f < 2 or f % 2 for f in pc.num_frames):
        raise ValueError(
            f"pretrain.num_frames must be even counts >= 2 (2 per temporal patch), got {pc.num_frames}"
        )


def _target(record: dict) -> str:
    return record["target"]
