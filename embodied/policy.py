"""The policy: any local Qwen2-VL / Qwen2.5-VL folder (or the built-in tiny one) and what it does.

Loading, prompts, batching with video, sampling, and per-token log-probs. Moving from the tiny model
to `Qwen/Qwen2.5-VL-3B-Instruct` is a change of `policy.path` (and dtype/device) in the config.
One path serves SFT, GRPO and evaluation: prompts are encoded left-padded, completions are appended
on the right, and `completion_logprobs` scores the completion tokens.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from embodied.tasks import format_question
from embodied.tiny import TinySpec, build_tiny_policy
from embodied.video import Clip, VideoConfig, processor_video_kwargs


@dataclass
class PolicyConfig:
    """Which model, in what precision, where."""

    path: str = "tiny"
    """A local Hugging Face folder (Qwen2-VL / Qwen2.5-VL), or `tiny` for the built-in 1.6 M model."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16."""
    device: str = "cpu"
    """cpu | cuda | cuda:N."""
    tiny_seed: int = 0
    """Initialisation seed of the tiny model (only for path=tiny)."""


def resolve_policy_path(path: str | None, seed: int = 0) -> Path:
    """`path` if given (must be a local folder), else the cached tiny model for `seed`."""
    if not path or path == "tiny":
        return build_tiny_policy(spec=TinySpec(seed=seed))
    p = Path(path).expanduser()
    if not (p / "config.json").exists():
        raise FileNotFoundError(
            f"policy.path={path!r} is not a local Hugging Face model folder (no config.json there). "
            "Download the checkpoint to a folder first (this framework never fetches from a hub), "
            "or use policy.path=tiny for the built-in tiny model."
        )
    return p


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(path: str | Path, dtype: str = "float32", device: str = "cpu"):
    """Load a local Qwen2-VL / Qwen2.5-VL folder: returns `(model, processor)`.

    `trust_remote_code=False` always; weights come from safetensors.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-shard bars are noise next to the training bars

    if dtype not in DTYPES:
        raise ValueError(f"policy.dtype={dtype!r}; choose one of {sorted(DTYPES)}")
    processor = AutoProcessor.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(
        path, dtype=DTYPES[dtype], trust_remote_code=False, local_files_only=True, use_safetensors=True
    ).to(device)
    processor.tokenizer.padding_side = "left"  # generation appends on the right
    if processor.tokenizer.pad_token is None:
        processor.tokenizer.pad_token = processor.tokenizer.eos_token
    return model, processor


def save_policy(model, processor, out: str | Path) -> None:
    """Save as a Hugging Face folder, atomically: a temporary folder renamed over the target."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    model.save_pretrained(tmp, safe_serialization=True)
    processor.save_pretrained(tmp)
    old = out.with_name(f".{out.name}.old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load(cfg: PolicyConfig):
    """`(model, processor)` for a `PolicyConfig`."""
    return load_policy(resolve_policy_path(cfg.path, cfg.tiny_seed), cfg.dtype, cfg.device)


# --- prompts and batches ----------------------------------------------------------------------------


def prompt_text(processor, record: dict) -> str:
    """The chat-formatted prompt for a record, ending where the assistant starts answering."""
    media = (
        [{"type": "video"}] if "video" in record else [{"type": "image"} for _ in record.get("images", [])]
    )
    content = [*media, {"type": "text", "text": format_question(record["question"], record["options"])}]
    messages = [{"role": "user", "content": content}]
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompts(
    processor, records: Sequence[dict], clips: Sequence[Clip], video: VideoConfig, device="cpu"
):
    """Left-padded prompt batch with the clips' pixels, grids and correct video metadata."""
    texts = [prompt_text(processor, r) for r in records]
    batch = processor(text=texts, padding=True, return_tensors="pt", **processor_video_kwargs(clips, video))
    return batch.to(device)


def select_rows(batch, rows: Sequence[int]):
    """The prompts `rows` of `batch` (repeats allowed), each with its own visual inputs.

    Videos and images are flattened across the batch into patch rows; each prompt's block of patches is
    found from its grid (`t * h * w` patches) and moved with it.
    """
    index = torch.as_tensor(list(rows), dtype=torch.long)
    out = {k: v[index.to(v.device)] for k, v in batch.items() if k in _PER_SEQUENCE}
    for pix, grid, extra in (
        ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"),
        ("pixel_values", "image_grid_thw", None),
    ):
        if pix not in batch:
            continue
        if batch[grid].shape[0] != batch["input_ids"].shape[0]:
            raise NotImplementedError(f"select_rows needs exactly one video or image per prompt ({grid})")
        chunks = batch[pix].split(batch[grid].prod(-1).tolist())
        out[pix] = torch.cat([chunks[i] for i in index.tolist()])
        out[grid] = batch[grid][index.to(batch[grid].device)]
        if extra and extra in batch:
            out[extra] = batch[extra][index.to(batch[extra].device)]
    return out


def repeat_batch(batch, n: int):
    """Each prompt of `batch` repeated `n` times in a row (a GRPO group), visual inputs included."""
    return select_rows(batch, [i for i in range(batch["input_ids"].shape[0]) for _ in range(n)])


_PER_SEQUENCE = ("input_ids", "attention_mask", "mm_token_type_ids")
_VISUAL = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts", "pixel_values", "image_grid_thw")


def completion_mask(ids: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """`(B, T)` 1 up to and including each row's first end-of-turn token, 0 after it."""
    is_eos = torch.isin(ids, torch.tensor(list(eos_ids), device=ids.device))
    after = (is_eos.cumsum(1) - is_eos.long()) > 0  # strictly after the first eos
    return (~after).long()


def eos_token_ids(model, processor) -> list[int]:
    ids = model.generation_config.eos_token_id or processor.tokenizer.eos_token_id
    ids = ids if isinstance(ids, list) else [ids]
    im_end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    return sorted({*ids, im_end} - {None})


def vision_token_ids(processor) -> list[int]:
    """Placeholder tokens that only the processor may place; a sampled one would corrupt the inputs."""
    tok = processor.tokenizer
    names = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
    ids = [tok.convert_tokens_to_ids(n) for n in names]
    return [i for i in ids if i is not None and i != tok.unk_token_id]


class _RowTemperature(LogitsProcessor):
    """Divides each row's logits by its own temperature `(B,)`: one group can mix temperatures."""

    def __init__(self, temperature: torch.Tensor):
        self.t = temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores / self.t.to(scores).unsqueeze(1)


@torch.no_grad()
def generate(
    model,
    processor,
    batch,
    max_new_tokens: int,
    temperature: float | torch.Tensor = 1.0,
    do_sample: bool = True,
):
    """Sample completions for a prompt batch: `(ids (B, T), mask (B, T))`, padding after the first eos.

    `temperature` is one number, or a `(B,)` tensor giving each row its own.
    """
    eos = eos_token_ids(model, processor)
    per_row = isinstance(temperature, torch.Tensor)
    kwargs = {"do_sample": False}
    if do_sample:
        kwargs = {"do_sample": True, "temperature": 1.0 if per_row else temperature, "top_p": 1.0, "top_k": 0}
        if per_row:
            kwargs["logits_processor"] = LogitsProcessorList([_RowTemperature(temperature)])
    out = model.generate(
        **batch,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=processor.tokenizer.pad_token_id,
        suppress_tokens=vision_token_ids(processor),
        **kwargs,
    )
    ids = out[:, batch["input_ids"].shape[1] :]
    return ids, completion_mask(ids, eos)


def completion_logprobs(
    model,
    batch,
    ids: torch.Tensor,
    mask: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
):
    """Per-token log-probs `(B, T)` of completion `ids` after the prompts of `batch`.

    Logits are divided by `temperature` (a number, or `(B,)` per row) so that the log-probs are those of
    the distribution each row was sampled from. Only the last T+1 positions' logits are materialised.
    With `with_entropy`, also returns the per-token entropy `(B, T)` of that distribution (detached unless
    `entropy_grad`).
    """
    prompt_len = batch["input_ids"].shape[1]
    inputs = {k: v for k, v in batch.items() if k in _VISUAL}
    inputs["input_ids"] = torch.cat([batch["input_ids"], ids], dim=1)
    inputs["attention_mask"] = torch.cat(
        [batch["attention_mask"], mask.to(batch["attention_mask"].dtype)], dim=1
    )
    if "mm_token_type_ids" in batch:
        mm = batch["mm_token_type_ids"]
        inputs["mm_token_type_ids"] = torch.cat([mm, torch.zeros_like(ids, dtype=mm.dtype)], dim=1)
    t = ids.shape[1]
    logits = model(**inputs, use_cache=False, logits_to_keep=t + 1).logits[:, :-1].float()
    assert logits.shape[1] == t and inputs["input_ids"].shape[1] == prompt_len + t
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.to(logits).view(-1, 1, 1)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    token_logp = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return token_logp
    entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy if entropy_grad else entropy.detach()


def encode_completions(processor, texts: Sequence[str], device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize target completions (each followed by the end-of-turn token), right-padded."""
    tok = processor.tokenizer
    rows = [tok(t + "<|im_end|>", add_special_tokens=False)["input_ids"] for t in texts]
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
