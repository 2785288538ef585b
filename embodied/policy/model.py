"""The policy: any local image-text-to-text folder (or a built-in tiny one) and what it does.

Loading, prompts, batching with video, sampling, and per-token log-probs. Moving from the tiny model
to `Qwen/Qwen2.5-VL-3B-Instruct` or `Qwen/Qwen3-VL-4B-Instruct` is a change of `policy.path` (and
dtype/device) in the config. What differs between model architectures (how a clip becomes processor inputs,
the chat template's media parts, the end-of-turn text) is asked of `embodied.policy.architectures`.
One path serves SFT, GRPO and evaluation: prompts are encoded left-padded, completions are appended
on the right, and `completion_logprobs` scores the completion tokens.
"""

from __future__ import annotations

import itertools
import math
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from embodied.policy.architectures import architecture_of, check_trainable, model_type_of, visual_items
from embodied.policy.config import PolicyConfig  # noqa: F401  (the `policy` section, re-exported)
from embodied.policy.expand import expand_layers
from embodied.policy.groups import (
    PIXEL_KEYS,
    PROMPT_KEYS,
    VISUAL_KEYS,
    GroupedBatch,
    is_grouped,
    sampling_prefill,
    shared_prefix_logits,
    shared_visual_features,
)
from embodied.policy.lora import (
    apply_lora,
    enable_gradient_checkpointing,
    has_lora,
    is_checkpointing,
)
from embodied.policy.random_weights import (
    build_random_policy,
    contiguous_head_input,
    is_random,
    mask_undecodable,
)
from embodied.policy.saving import save_merged
from embodied.policy.tiny import SHIPPED, SHIPPED_QWEN3_VL, SHIPPED_WORLDS, TinySpec, build_tiny_policy
from embodied.questions import format_question
from embodied.video import Clip, VideoConfig


def resolve_policy_path(path: str | None, seed: int = 0) -> Path:
    """`path` if given (must be a local folder); `tiny-base`: the perception-pretrained tiny base shipped
    in the package (`tiny-base-qwen3-vl`: its Qwen3-VL twin); `tiny-worlds`: the same base continued on every
    simulated world's captions; `tiny`: the
    randomly initialised tiny model for `seed` (built and cached); `tiny:qwen3-vl` / `tiny:qwen3.5`: a tiny
    randomly initialised model of that family."""
    if is_random(path):
        raise ValueError(
            f"policy.path={path!r} has no folder: a random: policy is built in memory by "
            "embodied.policy.model.load (save it with save_policy if a folder is needed)"
        )
    shipped = {
        "tiny-base": (SHIPPED, ""),
        "tiny-worlds": (SHIPPED_WORLDS, "-c configs/pretrain_worlds.yaml "),
        "tiny-base-qwen3-vl": (SHIPPED_QWEN3_VL, "pretrain.architecture=qwen3-vl "),
    }
    if path in shipped:
        folder, config = shipped[path]
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"the {path} policy is missing from {folder}; rebuild it with `embodied pretrain {config}"
                f"pretrain.out={folder}`"
            )
        return folder
    if not path or path == "tiny":
        return build_tiny_policy(spec=TinySpec(seed=seed))
    if path.startswith("tiny:"):
        return build_tiny_policy(spec=TinySpec(seed=seed), architecture=path.removeprefix("tiny:"))
    p = Path(path).expanduser()
    if not (p / "config.json").exists():
        raise FileNotFoundError(
            f"policy.path={path!r} is not a local Hugging Face model folder (no config.json there). "
            "Download the checkpoint to a folder first (this framework never fetches from a hub), "
            "or use policy.path=tiny for the built-in tiny model."
        )
    require_safetensors(p)
    return p


def require_safetensors(folder: str | Path) -> None:
    """Refuse a model folder whose weights are only pickled (`*.bin`, as old checkpoints ship them): loading a
    pickle can run arbitrary code, so weights load from safetensors only. Raises `ValueError` with one line
    that says how to convert the folder once, for a user who trusts the file."""
    p = Path(folder)
    pickled = sorted(x.name for x in p.glob("*.bin"))
    if not pickled or any(p.glob("*.safetensors")):
        return
    names = ", ".join(pickled[:2]) + (", ..." if len(pickled) > 2 else "")
    convert = (
        "from transformers import AutoModelForImageTextToText as M; "
        f"M.from_pretrained({str(p)!r}, use_safetensors=False).save_pretrained({str(p)!r})"
    )
    raise ValueError(
        f"{p} holds only pickled weights ({names}), which are refused: unpickling can run arbitrary code. "
        f'If you trust the file, convert it to safetensors once: python -c "{convert}"'
    )


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def check_model_folder(folder: str | Path) -> None:
    """Refuse, in one line naming the folder and what is missing, a folder that is not a vision-language
    model transformers can load offline: a model type unknown to the installed transformers, a text-only
    language model, or a checkpoint without its processor or tokenizer files."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    p = Path(folder)
    model_type = model_type_of(p)
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ValueError(
            f"{p}: config.json names model_type {model_type!r}, which transformers "
            f"{transformers.__version__} does not know; upgrade transformers or check the folder "
            "(remote code is never run)"
        )
    if model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        raise ValueError(
            f"{p}: model_type {model_type!r} is not a vision-language model (no image-text-to-text class); "
            "embodied needs one that takes video or images, e.g. Qwen2.5-VL or Qwen3-VL"
        )
    if not any((p / f).is_file() for f in _PROCESSOR_FILES):
        raise ValueError(
            f"{p}: no processor files ({' or '.join(_PROCESSOR_FILES)}); copy them from the original "
            "checkpoint (they come with its weights)"
        )
    if not any((p / f).is_file() for f in _TOKENIZER_FILES):
        raise ValueError(
            f"{p}: no tokenizer files ({' or '.join(_TOKENIZER_FILES[:2])}); copy them from the original "
            "checkpoint"
        )


def load_policy(path: str | Path, dtype: str = "float32", device: str = "cpu"):
    """Load a local image-text-to-text folder (Qwen2/2.5/3-VL, Qwen3.5, or any other architecture for
    evaluation): returns `(model, processor)`.

    `trust_remote_code=False` always; weights come from safetensors.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-shard bars are noise next to the training bars

    if dtype not in DTYPES:
        raise ValueError(f"policy.dtype={dtype!r}; choose one of {sorted(DTYPES)}")
    check_model_folder(path)
    processor = AutoProcessor.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(
        path, dtype=DTYPES[dtype], trust_remote_code=False, local_files_only=True, use_safetensors=True
    ).to(device)
    architecture_of(model).patch_vision_attention(model)  # the same numbers, fewer calls (e.g. Qwen2.5-VL)
    mask_undecodable(model)  # a folder saved from a `random:` policy: its decodable ids only
    contiguous_head_input(model)  # no float32 copy of a bf16 head per call on the CPU
    processor.tokenizer.padding_side = "left"  # generation appends on the right
    if processor.tokenizer.pad_token is None:
        processor.tokenizer.pad_token = processor.tokenizer.eos_token
    return model, processor


def save_policy(model, processor, out: str | Path, state: dict | None = None) -> None:
    """Save as a Hugging Face folder, atomically: a temporary folder renamed over the target.

    A LoRA policy is saved with its adapters merged into the base weights: the folder loads like any
    checkpoint (no peft needed) and the live model keeps training with its adapters unmerged. `state`
    replaces the model's own state dict (FSDP passes the gathered one).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    if has_lora(model):  # streamed: one merged weight at a time (embodied/policy/saving.py)
        save_merged(model, tmp)
    else:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state)
    processor.save_pretrained(tmp)
    old = out.with_name(f".{out.name}.old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load(cfg: PolicyConfig, command: str = ""):
    """`(model, processor)` for a `PolicyConfig`, with new layers (`expand_layers`), LoRA adapters and
    gradient checkpointing if set. With `command` (a training loop's name) an architecture that the loops do
    not take is refused in one line, a folder's before its weights load."""
    folder = Path(cfg.path).is_dir()
    if command and folder:  # a folder's model type is read from its config.json, before its weights
        check_trainable(model_type_of(cfg.path), cfg.path, command)
    if is_random(cfg.path):
        if cfg.dtype not in DTYPES:
            raise ValueError(f"policy.dtype={cfg.dtype!r}; choose one of {sorted(DTYPES)}")
        args = (cfg.path, DTYPES[cfg.dtype], cfg.device, cfg.processor, cfg.tiny_seed)
        model, processor = build_random_policy(*args)
    else:
        model, processor = load_policy(resolve_policy_path(cfg.path, cfg.tiny_seed), cfg.dtype, cfg.device)
    if command and not folder:  # a built one's (`tiny`, `random:...`) is known once it is built
        check_trainable(model.config.model_type, cfg.path, command)
    if cfg.expand_layers:
        expand_layers(model, cfg.expand_layers)
    if cfg.lora_rank > 0:
        apply_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets, cfg.lora_vision)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model, processor


# --- prompts and batches ----------------------------------------------------------------------------


def prompt_text(processor, record: dict, frames: int = 0) -> str:
    """The chat-formatted prompt for a record, ending where the assistant starts answering (`frames`: the
    clip's frame count, for an architecture that takes a video's frames as images)."""
    media = architecture_of(processor).media_parts(record, frames)
    text = format_question(record["question"], record["options"], record.get("instruction"))
    content = [*media, {"type": "text", "text": text}]
    messages = [{"role": "user", "content": content}]
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def media_kwargs(processor, records: Sequence[dict], clips: Sequence[Clip], video: VideoConfig) -> dict:
    """Processor keyword arguments for the visual inputs of `records`, as the processor's architecture sizes
    them.

    A record with `video` gets its clip as a video (with its metadata), or as its frames where the
    architecture takes no video. A record with `images` instead gets its clip's frames as that many separate
    images, in order (the frames are the images). Each modality has its own kwargs dict, since the processor
    rejects a shared `size` next to them.
    """
    arch = architecture_of(processor)
    vids, imgs = [], []
    for r, c in zip(records, clips, strict=True):
        if "video" in r:
            (vids if arch.videos_as_video else imgs).append(c)
            continue
        if len(r.get("images", [])) != len(c.frames):
            raise ValueError(
                f"record {r.get('id', '?')}: {len(r.get('images', []))} images but its clip has "
                f"{len(c.frames)} frames; an image record's clip must hold exactly its images"
            )
        imgs.append(c)
    kwargs: dict = {}
    if vids:
        kwargs |= arch.video_inputs(vids, video)
    if imgs:
        kwargs |= arch.image_inputs(imgs, video)
    return kwargs


def encode_prompts(
    processor, records: Sequence[dict], clips: Sequence[Clip], video: VideoConfig, device="cpu"
):
    """Left-padded prompt batch with the clips' pixels, grids and correct video metadata.

    Records with `video` see their clip as a video; records with `images` see its frames as images.
    """
    texts = [prompt_text(processor, r, len(c.frames)) for r, c in zip(records, clips)]
    batch = processor(
        text=texts, padding=True, return_tensors="pt", **media_kwargs(processor, records, clips, video)
    )
    return batch.to(device)


def conversation_text(processor, record: dict, history: Sequence[tuple[str, str]] = ()) -> str:
    """The chat-formatted prompt of a later turn: the record's question with its clip, then for each earlier
    turn `(answer, words)` the answer as an assistant message and a user message with one more video (that
    answer's outcome) and `words`; ending where the assistant answers. No history: `prompt_text`."""
    if not history:
        return prompt_text(processor, record)
    if "video" not in record:
        raise ValueError(f"record {record.get('id', '?')}: multi-turn prompts need a video record")
    text = format_question(record["question"], record["options"], record.get("instruction"))
    video = architecture_of(processor).media_parts(record)
    messages = [{"role": "user", "content": [*video, {"type": "text", "text": text}]}]
    for answer, words in history:
        messages.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
        messages.append({"role": "user", "content": [*video, {"type": "text", "text": words}]})
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_conversations(
    processor,
    records: Sequence[dict],
    clips: Sequence[Sequence[Clip]],
    history: Sequence[Sequence[tuple[str, str]]],
    video: VideoConfig,
    device="cpu",
):
    """Left-padded batch of later-turn prompts (`conversation_text`): row i sees `clips[i]` (the episode's
    clip, then one outcome clip per turn of `history[i]`) as that many videos, in order."""
    for r, c, h in zip(records, clips, history, strict=True):
        if len(c) != len(h) + 1:
            raise ValueError(
                f"record {r.get('id', '?')}: {len(c)} clips for {len(h)} earlier turns (need one more)"
            )
    texts = [conversation_text(processor, r, h) for r, h in zip(records, history)]
    arch = architecture_of(processor)
    if not arch.videos_as_video:
        raise ValueError(f"{type(processor).__name__} takes no video; multi-turn episodes need one")
    media = arch.video_inputs([clip for row in clips for clip in row], video)
    batch = processor(text=texts, padding=True, return_tensors="pt", **media)
    return batch.to(device)


def encode_examples(processor, examples: Sequence, video: VideoConfig, device="cpu"):
    """`encode_prompts` of `Example`s; when one is a later turn (its `history` not empty), every row is
    encoded as a conversation (`encode_conversations`: a plain prompt's conversation is its prompt)."""
    records = [e.record for e in examples]
    if not any(e.history for e in examples):
        return encode_prompts(processor, records, [e.clip for e in examples], video, device)
    clips = [[e.clip, *e.outcomes] for e in examples]
    return encode_conversations(processor, records, clips, [e.history for e in examples], video, device)


def concat_batches(batches: Sequence, pad_id: int) -> dict:
    """One left-padded batch holding the rows of `batches` in order (a `GroupedBatch` is materialised):
    prompt tensors left-padded to the longest, visual tensors concatenated."""
    batches = [dict(b) for b in batches]
    width = max(b["input_ids"].shape[1] for b in batches)
    out: dict = {}
    fill = {"input_ids": pad_id, "attention_mask": 0, "mm_token_type_ids": 0}
    for key in PROMPT_KEYS:
        if key in batches[0]:
            parts = [
                torch.nn.functional.pad(b[key], (width - b[key].shape[1], 0), value=fill[key])
                for b in batches
            ]
            out[key] = torch.cat(parts)
    for key in VISUAL_KEYS:
        parts = [b[key] for b in batches if key in b]
        if parts:
            out[key] = torch.cat(parts)
    return out


def select_rows(batch, rows: Sequence[int], pixels: bool = True):
    """The prompts `rows` of `batch` (repeats allowed), each with its own visual inputs.

    Videos and images are flattened across the batch into patch rows; each prompt's items are counted
    from its runs of visual tokens (`mm_token_type_ids`: any number of images, or a video, per prompt) and
    each item's block of patches is found from its grid (`t * h * w` patches) and moved with it. From a
    `GroupedBatch`, rows that are whole groups in order give a `GroupedBatch` again (all its rows: itself).
    `pixels=False` leaves the pixel tensors out (grids and the rest are selected).
    """
    rows = list(rows)
    if isinstance(batch, GroupedBatch):
        groups = _whole_groups(rows, batch.group)
        if groups is not None:
            n = batch.unique["input_ids"].shape[0]
            return (
                batch
                if groups == list(range(n))
                else repeat_batch(select_rows(batch.unique, groups), batch.group)
            )
        batch.materialize()
    index = torch.as_tensor(rows, dtype=torch.long)
    out = {k: v[index.to(v.device)] for k, v in batch.items() if k in PROMPT_KEYS}
    for pix, grid, extra, type_id in (
        ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts", 2),
        ("pixel_values", "image_grid_thw", None, 1),
    ):
        if pix not in batch:
            continue
        counts = _items_per_row(batch, grid, type_id)
        if not counts:
            continue
        starts = [0, *itertools.accumulate(counts)]
        items = [j for i in index.tolist() for j in range(starts[i], starts[i] + counts[i])]
        if not items:
            continue
        if pixels:
            chunks = batch[pix].split(batch[grid].prod(-1).tolist())
            out[pix] = torch.cat([chunks[j] for j in items])
        sel = torch.as_tensor(items, dtype=torch.long, device=batch[grid].device)
        out[grid] = batch[grid][sel]
        if extra and extra in batch:
            out[extra] = batch[extra][sel.to(batch[extra].device)]
    return out


def trim_left_padding(batch: dict) -> dict:
    """`batch` (left-padded prompts, e.g. rows picked by `select_rows`) without the leading columns that are
    padding on every row: the batch the processor would have made of these rows alone."""
    width = int(batch["attention_mask"].sum(1).max())
    return {k: v[:, -width:] if k in PROMPT_KEYS else v for k, v in batch.items()}


def _items_per_row(batch, grid: str, type_id: int) -> list[int]:
    """Videos (type 2) or images (type 1) of each prompt."""
    n = batch["input_ids"].shape[0]
    if grid not in batch:
        raise ValueError(
            f"this batch has no {grid}: its rows cannot be split (an architecture without visual grids is "
            "evaluated by greedy answers only)"
        )
    if "mm_token_type_ids" in batch:
        return visual_items(batch, grid, type_id)
    if batch[grid].shape[0] != n:
        raise ValueError(f"{grid} has {batch[grid].shape[0]} rows for {n} prompts and no mm_token_type_ids")
    return [1] * n


def _whole_groups(rows: list[int], group: int) -> list[int] | None:
    """The group indices if `rows` are whole groups of `group` consecutive rows, in order; else None."""
    if not rows or len(rows) % group:
        return None
    firsts = rows[::group]
    if any(f % group for f in firsts):
        return None
    if rows != [f + j for f in firsts for j in range(group)]:
        return None
    return [f // group for f in firsts]


def repeat_batch(batch, n: int) -> GroupedBatch:
    """Each prompt of `batch` repeated `n` times in a row (a GRPO group), visual inputs included (the
    repeated pixels are made only if read: see `GroupedBatch`)."""
    rows = [i for i in range(batch["input_ids"].shape[0]) for _ in range(n)]

    def pixels() -> dict:
        return {k: v for k, v in select_rows(batch, rows).items() if k in PIXEL_KEYS}

    return GroupedBatch(select_rows(batch, rows, pixels=False), batch, n, pixels)


def completion_mask(ids: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """`(B, T)` 1 up to and including each row's first end-of-turn token, 0 after it."""
    is_eos = torch.isin(ids, torch.tensor(list(eos_ids), device=ids.device))
    after = (is_eos.cumsum(1) - is_eos.long()) > 0  # strictly after the first eos
    return (~after).long()


def eos_token_ids(model, processor) -> list[int]:
    """The tokens that end an answer: the model's eos tokens and its architecture's end-of-turn token."""
    ids = model.generation_config.eos_token_id or processor.tokenizer.eos_token_id
    ids = ids if isinstance(ids, list) else [ids]
    tok = processor.tokenizer
    end = tok.convert_tokens_to_ids(architecture_of(processor).end_text(tok))
    ends = {*ids} | ({end} if end != tok.unk_token_id else set())
    return sorted(ends - {None})


def vision_token_ids(processor) -> list[int]:
    """Placeholder tokens that only the processor may place; a sampled one would corrupt the inputs."""
    return architecture_of(processor).placeholder_ids(processor)


def _sharded(model) -> bool:
    """True for a model sharded by FSDP2 (`fully_shard` makes the root an `FSDPModule`)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


class _RowTemperature(LogitsProcessor):
    """Divides each row's logits by its own temperature `(B,)`: one group can mix temperatures."""

    def __init__(self, temperature: torch.Tensor):
        self.t = temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores / self.t.to(scores).unsqueeze(1)


class _MinP(LogitsProcessor):
    """Min-p truncation on the model's own distribution: only tokens whose probability is at least `min_p`
    times the most likely token's stay possible. Applied before any temperature, so a hot temperature then
    spreads the mass over the tokens the policy already considers (e.g. the option letters) and not over the
    vocabulary's tail, which breaks the answer format."""

    def __init__(self, min_p: float):
        self.log_min_p = math.log(min_p)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(scores.float(), dim=-1)
        drop = logp < logp.amax(-1, keepdim=True) + self.log_min_p
        return scores.masked_fill(drop, -float("inf"))


class _RowSeededSampler(LogitsProcessor):
    """Draws row r's next token from softmax(scores[r]) with its own generator, seeded `seeds[r]`, and
    leaves only that token possible, so the sampler that follows picks it.

    A row's tokens then depend on its seed and its own logits only, not on which other rows share the
    batch: the same prompt gets the same answers in one process or split across several, and in any
    micro-batch. The draw is by inverse CDF, one uniform per row (30 ms for 32 rows of a 152k vocabulary on
    one CPU core; `torch.multinomial` with per-row generators took 230 ms).
    """

    def __init__(self, seeds: Sequence[int], device: torch.device):
        self.gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float()
        cdf = (logits - logits.amax(-1, keepdim=True)).exp_().cumsum_(-1)  # unnormalised; -inf adds 0
        u = torch.cat([torch.rand(1, generator=g, device=g.device) for g in self.gens])
        # right=True: the first token whose cumulative weight exceeds u * total, never a 0-weight one
        picks = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True)
        picks = picks.clamp_max_(scores.shape[-1] - 1)
        return torch.full_like(scores, -float("inf")).scatter_(1, picks, 0.0)


@torch.no_grad()
def generate(
    model,
    processor,
    batch,
    max_new_tokens: int,
    temperature: float | torch.Tensor = 1.0,
    do_sample: bool = True,
    seeds: Sequence[int] | None = None,
    share_prompt: bool = True,
    min_p: float = 0.0,
):
    """Sample completions for a prompt batch: `(ids (B, T), mask (B, T))`, padding after the first eos.

    `temperature` is one number, or a `(B,)` tensor giving each row its own. `min_p` > 0 first drops
    every token below `min_p` times the top token's probability (at temperature 1, `_MinP`). `seeds` (one
    int per row) makes each row's sample a function of its seed and prompt alone, whatever else is in the
    batch. A grouped batch sampled with seeds runs each prompt once (`share_prompt`; False: Hugging Face's
    `generate` over every repeated row, the same tokens at more cost).
    """
    eos = eos_token_ids(model, processor)
    if seeds is not None and len(seeds) != batch["input_ids"].shape[0]:
        raise ValueError(f"{len(seeds)} seeds for a batch of {batch['input_ids'].shape[0]} rows")
    if not 0.0 <= min_p < 1.0:
        raise ValueError(f"min_p={min_p}: must be in [0, 1)")
    if (seeds is not None or min_p > 0) and not isinstance(temperature, torch.Tensor):
        # the temperature must act after min-p and before the seeded draw, so it goes in the processor list
        temperature = torch.full((batch["input_ids"].shape[0],), float(temperature))
    per_row = isinstance(temperature, torch.Tensor)
    kwargs = {"do_sample": False}
    if do_sample:
        kwargs = {"do_sample": True, "temperature": 1.0 if per_row else temperature, "top_p": 1.0, "top_k": 0}
        procs = [_MinP(min_p)] if min_p > 0 else []
        procs += [_RowTemperature(temperature)] if per_row else []
        if seeds is not None:
            procs.append(_RowSeededSampler(seeds, batch["input_ids"].device))
        if procs:  # rows of the expanded batch, in the same order as the repeated one
            kwargs["logits_processor"] = LogitsProcessorList(procs)
    if share_prompt and do_sample and seeds is not None and is_grouped(batch) and not _sharded(model):
        # the prompt runs once per group, not once per member: Hugging Face's generate would prefill the
        # G repeated copies of every prompt (most of a short rollout's compute)
        return _sample_shared_prefix(model, processor, batch, max_new_tokens, kwargs["logits_processor"], eos)
    # A group of samples of one prompt: generate encodes the prompt's pixels once and expands them.
    grouped = is_grouped(batch) and do_sample
    inputs = batch.unique if grouped else batch
    out = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=processor.tokenizer.pad_token_id,
        suppress_tokens=vision_token_ids(processor),
        num_return_sequences=batch.group if grouped else 1,
        synced_gpus=_sharded(model),  # FSDP: every process runs as many forward passes as the longest
        **kwargs,
    )
    ids = out[:, inputs["input_ids"].shape[1] :]
    return ids, completion_mask(ids, eos)


@torch.no_grad()
def _sample_shared_prefix(model, processor, batch: GroupedBatch, max_new_tokens: int, procs, eos):
    """`generate`'s seeded sampling for a grouped batch, with one pass over each prompt.

    The prompts' KV cache and last logits are computed once (`sampling_prefill`, which keeps that pass for
    the update when the batch asks) and repeated G times; each step then runs only the new token of all
    `B * G` rows. Token choice is Hugging Face's (`_sample`): the
    logits processors (vision placeholders suppressed, per-row temperature, the seeded draw), finished rows
    padded, stop when every row has ended or after `max_new_tokens`. Rows are drawn by their own seeds, so the
    global RNG is not used (Hugging Face's `multinomial` over the one-hot result only advanced it).
    """
    cache, logits, attention, start = sampling_prefill(model, batch)
    arch = architecture_of(model)
    pad = processor.tokenizer.pad_token_id
    suppress = torch.tensor(vision_token_ids(processor), device=logits.device)
    eos_t = torch.tensor(eos, device=logits.device)
    rows = logits.shape[0]
    unfinished = torch.ones(rows, dtype=torch.long, device=logits.device)
    tokens: list[torch.Tensor] = []
    for t in range(max_new_tokens):
        scores = logits.to(torch.float32, copy=True)
        if suppress.numel():
            scores[:, suppress] = -float("inf")
        scores = procs(None, scores)
        nxt = scores.argmax(-1) * unfinished + pad * (1 - unfinished)  # one finite entry per row
        tokens.append(nxt)
        unfinished = unfinished & ~torch.isin(nxt, eos_t)
        if not unfinished.any() or t == max_new_tokens - 1:
            break
        attention = torch.cat([attention, attention.new_ones(rows, 1)], dim=1)
        out = model(
            input_ids=nxt[:, None],
            attention_mask=attention,
            past_key_values=cache,
            position_ids=arch.continued_positions(start, t),
            use_cache=True,
            logits_to_keep=1,
        )
        cache, logits = out.past_key_values, out.logits[:, -1]
    ids = torch.stack(tokens, dim=1)
    return ids, completion_mask(ids, eos)


class CompletionOutputs(NamedTuple):
    """What one pass over prompts + completions gives (`completion_outputs`): per completion token,
    `(B, T)` each."""

    logp: torch.Tensor
    """The log-probs of the completion tokens."""
    entropy: torch.Tensor | None = None
    """The entropy of each token's distribution (asked with `entropy`; else None)."""
    values: torch.Tensor | None = None
    """A value head's values (asked with `value_head`; else None)."""


def completion_logprobs(
    model,
    batch,
    ids: torch.Tensor,
    mask: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    suppress: Sequence[int] = (),
) -> torch.Tensor:
    """Per-token log-probs `(B, T)` of completion `ids` after the prompts of `batch`: `completion_outputs`'s
    `logp` (see there for `temperature` and `suppress`)."""
    return completion_outputs(model, batch, ids, mask, temperature, suppress=suppress).logp


def completion_outputs(
    model,
    batch,
    ids: torch.Tensor,
    mask: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    entropy: str = "",
    value_head: torch.nn.Module | None = None,
    suppress: Sequence[int] = (),
    prefix: tuple | None = None,
) -> CompletionOutputs:
    """Per-token log-probs `(B, T)` of completion `ids` after the prompts of `batch`, and what else was asked.

    Logits are divided by `temperature` (a number, or `(B,)` per row) so that the log-probs are those of
    the distribution each row was sampled from. Only the last T+1 positions' logits are materialised.
    `entropy`: "" none; "detached" or "grad" the per-token entropy `(B, T)` of that distribution, without or
    with its gradient.

    With `value_head` (a module mapping last hidden states `(B, T, H)` to `(B, T)`, e.g. `rl.ppo.ValueHead`)
    the `values` `(B, T)`: `values[:, t]` is read from the very hidden state whose logits predict token t, so
    it is V(prompt + completion[:t]), the state before token t. This always runs the full pass (the
    shared-prefix pass of a grouped batch keeps no hidden states).

    `suppress`: token ids the samplers never draw (`vision_token_ids`), left out of the softmax: the
    log-probs of the distribution a sample was actually drawn from, as an engine reports them.

    `prefix`: the pass over a grouped batch's prompts that the sampler kept with `model`'s weights
    (`embodied.policy.groups.PromptPass.take`), used instead of running it again where the shared-prefix
    pass runs; None: it runs here.
    """
    if entropy not in ("", "detached", "grad"):
        raise ValueError(f"entropy={entropy!r}: choose '', 'detached' or 'grad'")
    checkpointing = model.training and is_checkpointing(model)
    # checkpointed layers drop the KV cache the shared prefix needs; DDP must see the whole forward
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) or _sharded(model):
        batch = dict(batch)  # a plain batch: every row runs its own full forward
    values = None
    if value_head is not None:
        logits, hidden = _full_forward(model, batch, ids, mask, hidden=True)
        values = value_head(hidden)
    elif is_grouped(batch) and not checkpointing:
        logits = shared_prefix_logits(model, batch, ids, mask, prefix)
    else:
        logits, _ = _full_forward(model, batch, ids, mask)
    logits = logits.float()
    if suppress:
        logits = logits.index_fill(-1, torch.tensor(list(suppress), device=logits.device), -torch.inf)
    assert logits.shape[:2] == ids.shape
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.to(logits).view(-1, 1, 1)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    token_logp = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    token_entropy = None
    if entropy:
        token_entropy = -(logp.exp() * logp).sum(-1)
        token_entropy = token_entropy if entropy == "grad" else token_entropy.detach()
    return CompletionOutputs(token_logp, token_entropy, values)


def _full_forward(
    model, batch, ids: torch.Tensor, mask: torch.Tensor, hidden: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits `(B, T, V)` predicting each completion token, from one pass over prompt + completion, and
    with `hidden` the last hidden states `(B, T, H)` (after the final norm) at the same positions."""
    grouped = is_grouped(batch)
    # the grouped batch's repeated pixels are never made here: its features come from `unique`
    inputs = {k: batch[k] for k in VISUAL_KEYS if k in batch and not (grouped and k in PIXEL_KEYS)}
    if grouped:  # the vision tower runs once per prompt, not once per sample
        inputs["mm_encoder_outputs"] = shared_visual_features(model, batch)
    inputs["input_ids"] = torch.cat([batch["input_ids"], ids], dim=1)
    inputs["attention_mask"] = torch.cat(
        [batch["attention_mask"], mask.to(batch["attention_mask"].dtype)], dim=1
    )
    if "mm_token_type_ids" in batch:
        mm = batch["mm_token_type_ids"]
        inputs["mm_token_type_ids"] = torch.cat([mm, torch.zeros_like(ids, dtype=mm.dtype)], dim=1)
    t = ids.shape[1]
    # the logits kept are those of the last T+1 positions; the last one predicts past the completion
    out = model(**inputs, use_cache=False, logits_to_keep=t + 1, output_hidden_states=hidden)
    return out.logits[:, :-1], out.hidden_states[-1][:, -(t + 1) : -1] if hidden else None


def end_of_turn(processor) -> str:
    """The text that closes an assistant message in the processor's architecture (`<|im_end|>` for Qwen)."""
    return architecture_of(processor).end_text(processor.tokenizer)


def encode_completions(processor, texts: Sequence[str], device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize target completions (each followed by the architecture's end-of-turn token), right-padded."""
    tok = processor.tokenizer
    end = end_of_turn(processor)
    rows = [tok(t + end, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids.to(device), mask.to(device)


def decode(processor, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Completion texts without padding and end-of-turn tokens."""
    return [processor.tokenizer.decode(row[m.bool()], skip_special_tokens=True) for row, m in zip(ids, mask)]
