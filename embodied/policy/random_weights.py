"""Real architectures with random weights: `policy.path=random:NAME` without any download.

NAME is one of the shipped configs in `embodied/assets/architectures/` (their README says where each
published value came from): `qwen2.5-vl-3b`, `qwen2.5-vl-7b`, `qwen3-vl-2b`, `qwen3-vl-4b`, `qwen3-vl-8b`,
`qwen3.5-0.8b`, `qwen3.5-2b` (Qwen3.5: natively multimodal, three linear-attention layers to one full one);
or `random:FILE.json`, any Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5 (dense) config.json. No weights are
read. On `policy.device=meta` the model is built with no memory at all (parameter counts, the FSDP2 wrap plan
and the memory plan of `embodied bench memory` come from it); on any other device its weights are allocated
and randomly initialised (seed `policy.tiny_seed`).

The processor. There is no hub, so the real Qwen tokenizers (151,643 BPE tokens for Qwen2.5-VL and
Qwen3-VL, a 248,320-row vocabulary for Qwen3.5) are not here. With `policy.processor=""` (the default) a
`random:` policy gets the tiny model's tokenizer (a 700-token byte-level BPE with Qwen's special tokens and
chat template, `embodied.policy.tiny`) together with the family's published image and video processor
settings: Qwen2.5-VL's (14 px patches, 2 x 2 merge, 2 frames per temporal patch, CLIP mean and std) or
Qwen3-VL's, which Qwen3.5 uses too (16 px patches, 2 x 2 merge, 2 frames per temporal patch, mean and std
0.5; `Qwen3VLProcessor` with `Qwen3VLVideoProcessor`). The config's special-token ids (image, video, vision
start and end, bos, eos, pad) are remapped to that tokenizer's ids, and every size stays the published one
(the embedding and the output layer keep all their rows). Such a policy runs end to end (prompts, video,
generation, loss) at the real size, but its text is not Qwen's.

The output layer is masked, not cut. With the tiny tokenizer (700 tokens) a randomly initialised 151,936- or
248,320-row output layer puts almost all its probability on ids that tokenizer cannot decode: every sampled
answer decoded to '' and every reward, advantage and gradient was 0 (issue 58). `mask_undecodable` adds a
hook on the output layer that sets the logits of every id past the tokenizer's length to -10,000, so
sampling, log-probs, entropies and the KL all see one distribution over decodable ids, while the layer keeps
its real size (at 0.8B its matrix is a quarter of the parameters and a large share of an update's work, so
cutting it would make the timings of `embodied bench step` not those of the real model). The limit is
recorded in the config (`embodied_decodable_vocab`), so a folder saved from such a policy (an SFT stage's
output) is masked again when it is loaded. `policy.processor=DIR`
takes the tokenizer and processor from a local folder instead (a checkpoint of the same family: its
tokenizer and processor files; weights are not needed) and keeps the published ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from embodied.policy.architectures import architecture_of

ARCHITECTURES = Path(__file__).parents[1] / "assets" / "architectures"
"""The shipped architecture configs: `<name>.json` (a published `config.json`) and each family's
`*-preprocessor.json` (its published processor settings)."""
PREFIX = "random:"
PREPROCESSOR = ARCHITECTURES / "qwen2.5-vl-preprocessor.json"
QWEN3_PREPROCESSOR = ARCHITECTURES / "qwen3-vl-preprocessor.json"
QWEN3_VIDEO_PREPROCESSOR = ARCHITECTURES / "qwen3-vl-video-preprocessor.json"
QWEN2_TYPES = ("qwen2_vl", "qwen2_5_vl")
QWEN3_TYPES = ("qwen3_vl", "qwen3_5")
"""Model types a `random:` config may have: Qwen2(.5)-VL, and Qwen3-VL with Qwen3.5 (same processor)."""
SPECIAL_IDS = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
    "vision_token_id": "<|vision_pad|>",
}
"""Config fields holding token ids, and the token each one names (text bos/eos/pad are handled apart)."""


def is_random(path: str | None) -> bool:
    """Whether `policy.path` asks for random weights (`random:NAME` or `random:FILE.json`)."""
    return bool(path) and str(path).startswith(PREFIX)


def _is_preprocessor(path: Path) -> bool:
    """Whether a shipped file holds processor settings (`*-preprocessor.json`), not an architecture."""
    return path.stem.endswith("preprocessor")


def known_architectures() -> list[str]:
    """Names accepted after `random:` (the shipped configs, not the processor settings beside them)."""
    return sorted(p.stem for p in ARCHITECTURES.glob("*.json") if not _is_preprocessor(p))


def architecture_file(spec: str) -> Path:
    """The config file of `random:NAME` (a shipped name) or `random:FILE.json` (any config.json of a
    supported family, e.g. a shrunken one for tests). Raises `ValueError` listing the known names."""
    name = spec[len(PREFIX) :] if spec.startswith(PREFIX) else spec
    shipped = ARCHITECTURES / f"{name}.json"
    if name and shipped.is_file() and not _is_preprocessor(shipped):
        return shipped
    path = Path(name).expanduser()
    if name.endswith(".json") and path.is_file():
        return path
    raise ValueError(
        f"policy.path={spec!r}: unknown architecture {name!r}. Known: "
        f"{', '.join(PREFIX + n for n in known_architectures())}, or random:/path/to/config.json "
        f"(configs live in {ARCHITECTURES})"
    )


MASKED_LOGIT = -1e4
"""The logit of an id the tokenizer cannot decode: exp() of it is 0 in float32, and unlike -inf it keeps
`p * log p` (the entropy) at 0."""
VOCAB_LIMIT = "embodied_decodable_vocab"
"""The config field naming how many output ids are decodable (set for a `random:` policy with the tiny
tokenizer; saved in config.json with the folder)."""


class _DecodableOnly:
    """Forward hook on an output layer: logits of ids `>= limit` set to `MASKED_LOGIT` (in place: the layer's
    backward needs its input and weight, not its output, so autograd allows it, and the masked entries get
    no gradient)."""

    def __init__(self, limit: int):
        self.limit = limit

    def __call__(self, module, args, out: torch.Tensor) -> torch.Tensor:
        out[..., self.limit :] = MASKED_LOGIT
        return out


def mask_undecodable(model, limit: int | None = None) -> int | None:
    """Mask `model`'s output layer to its first `limit` ids (default: the config's `embodied_decodable_vocab`,
    if set) and record the limit in the config; returns the limit, or None when nothing is masked."""
    limit = limit or getattr(model.config, VOCAB_LIMIT, None)
    head = model.get_output_embeddings()
    if not limit or head is None or limit >= head.out_features:
        return None
    setattr(model.config, VOCAB_LIMIT, int(limit))
    if not any(isinstance(h, _DecodableOnly) for h in head._forward_hooks.values()):
        head.register_forward_hook(_DecodableOnly(int(limit)))
    return int(limit)


def _contiguous_input(module, args):
    x = args[0]
    return (x.contiguous(), *args[1:]) if not x.is_contiguous() else None


def contiguous_head_input(model) -> None:
    """Give a half-precision output layer a contiguous input on the CPU.

    The loops keep only the last positions' logits (`logits_to_keep`), so the output layer gets a slice of
    the hidden states. torch's CPU `linear` on a strided bfloat16 input takes a path that holds a float32
    copy of the whole weight for the call: 0.95 GiB for Qwen3.5-0.8B's 248,320 x 1,024 head, measured as
    the peak of an SFT step (issue 58). Copying the few rows kept costs kilobytes. Float32 layers (the tiny
    models) take no such path and are left as they are.
    """
    head = model.get_output_embeddings()
    if head is None or head.weight.dtype not in (torch.bfloat16, torch.float16):
        return
    if head.weight.device.type == "cpu" and not any(
        h is _contiguous_input for h in head._forward_pre_hooks.values()
    ):
        head.register_forward_pre_hook(_contiguous_input)


def random_config(spec: str):
    """The `transformers` config of `random:NAME` (published values, nothing remapped)."""
    from transformers import AutoConfig

    where = architecture_file(spec)
    raw = json.loads(where.read_text())
    model_type = raw.get("model_type")
    if model_type not in (*QWEN2_TYPES, *QWEN3_TYPES):
        known = ", ".join((*QWEN2_TYPES, *QWEN3_TYPES))
        raise ValueError(f"{where}: model_type {model_type!r}; a random: config is one of {known}")
    return AutoConfig.for_model(**raw)


def _remap_special_ids(config, tokenizer) -> None:
    """Point the config's special-token ids at `tokenizer`'s ids for the same tokens (sizes unchanged).

    bos and pad become `<|endoftext|>` and eos `<|im_end|>`, the end of an assistant turn, for every family
    (Qwen3.5's config.json names `<|endoftext|>` as eos; its generation config stops at both)."""
    ids = {field: tokenizer.convert_tokens_to_ids(token) for field, token in SPECIAL_IDS.items()}
    for field, value in ids.items():
        if hasattr(config, field):
            setattr(config, field, value)
    text = config.get_text_config()
    bos, eos = tokenizer.convert_tokens_to_ids("<|endoftext|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")
    for holder in {id(c): c for c in (config, text)}.values():  # Qwen2.5-VL's file has them at the top
        holder.bos_token_id, holder.pad_token_id, holder.eos_token_id = bos, bos, eos
    if max(ids.values()) >= text.vocab_size:
        raise ValueError(f"tokenizer ids {ids} do not fit the vocabulary of {text.vocab_size}")


def _local_processor(processor_dir: str):
    """The processor saved in the local folder `processor_dir` (one line naming what is missing)."""
    from transformers import AutoProcessor

    folder = Path(processor_dir).expanduser()
    if not (folder / "tokenizer_config.json").is_file():
        raise FileNotFoundError(
            f"policy.processor={processor_dir!r} holds no tokenizer_config.json: give a local folder with "
            "the tokenizer and processor of a checkpoint of the same family (its small files, no weights "
            "needed), or leave policy.processor empty for the tiny tokenizer"
        )
    return AutoProcessor.from_pretrained(folder, trust_remote_code=False, local_files_only=True)


def _qwen2_processor(tokenizer, chat_template: str):
    """Qwen2.5-VL's published image and video settings around `tokenizer` (Qwen2-VL's are the same)."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    pre = json.loads(PREPROCESSOR.read_text())
    keys = ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size")
    settings = {k: pre[k] for k in (*keys, "image_mean", "image_std")}
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**settings),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(**settings, cap_pixels_per_frame=True, do_sample_frames=False),
        chat_template=chat_template,
    )


def _qwen3_processor(tokenizer, chat_template: str):
    """Qwen3-VL's published image and video settings around `tokenizer` (Qwen3.5 uses the same processor
    classes and grid). The framework samples the frames itself and passes their times
    (`do_sample_frames=False`); each frame's pixels are capped as qwen-vl-utils caps them."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    common = ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std", "size")
    image = json.loads(QWEN3_PREPROCESSOR.read_text())
    video = json.loads(QWEN3_VIDEO_PREPROCESSOR.read_text())
    frames = {k: video[k] for k in ("fps", "min_frames", "max_frames")}
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**{k: image[k] for k in common}),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(
            **{k: video[k] for k in common}, **frames, cap_pixels_per_frame=True, do_sample_frames=False
        ),
        chat_template=chat_template,
    )


def random_processor(processor_dir: str = "", model_type: str = "qwen2_5_vl"):
    """The processor of a `random:` policy of `model_type` (see the module docstring): the tiny tokenizer
    with the family's published image/video processor settings, or the processor saved in the local folder
    `processor_dir`."""
    if processor_dir:
        return _local_processor(processor_dir)
    from transformers import AutoTokenizer

    from embodied.policy.tiny import CHAT_TEMPLATE, build_tiny_policy

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_policy(), local_files_only=True)
    build = _qwen3_processor if model_type in QWEN3_TYPES else _qwen2_processor
    return build(tokenizer, CHAT_TEMPLATE)


def build_random_policy(
    spec: str,
    dtype: torch.dtype = torch.float32,
    device: str = "meta",
    processor_dir: str = "",
    seed: int = 0,
):
    """`(model, processor)` for `random:NAME`: the real model class of the shipped config
    (`Qwen2_5_VLForConditionalGeneration`, `Qwen3VLForConditionalGeneration`,
    `Qwen3_5ForConditionalGeneration`, ...) with random weights, in `dtype` on `device`.

    `device="meta"` allocates nothing (shapes only: counts and plans); any other device allocates and
    initialises every weight (3B: ~7.5 GB in bfloat16). `processor_dir`: see `random_processor`.
    """
    config = random_config(spec)
    processor = random_processor(processor_dir, config.model_type)
    if processor_dir:
        got = processor.tokenizer.convert_tokens_to_ids(SPECIAL_IDS["video_token_id"])
        if got != config.video_token_id:
            raise ValueError(
                f"policy.processor={processor_dir!r}: its <|video_pad|> is id {got}, the config's "
                f"video_token_id is {config.video_token_id}; use the tokenizer of the same model family"
            )
    else:
        _remap_special_ids(config, processor.tokenizer)
    model = instantiate(config, dtype, device, seed)
    if not processor_dir:  # the tiny tokenizer: only its ids can be decoded (module docstring)
        mask_undecodable(model, len(processor.tokenizer))
    contiguous_head_input(model)
    architecture_of(model).patch_vision_attention(model)
    processor.tokenizer.padding_side = "left"
    return model, processor


def instantiate(config, dtype: torch.dtype = torch.float32, device: str = "meta", seed: int = 0):
    """The model of a `transformers` config with random weights (seed `seed`) in `dtype` on `device`
    (`meta`: shapes only, nothing allocated)."""
    from transformers import AutoModelForImageTextToText

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForImageTextToText.from_config(config, dtype=dtype, trust_remote_code=False)
    return model.eval()


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Parameters of a Qwen-VL model (meta or real): `total` (tied weights once), `vision` (the vision tower
    with its mergers, Qwen3-VL's deepstack mergers included: every name under `visual.`), `language` (the
    rest: decoder, embeddings, head)."""
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for name, p in model.named_parameters() if ".visual." in f".{name}")
    return {"total": total, "vision": vision, "language": total - vision}
