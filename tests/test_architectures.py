"""Model architectures beyond Qwen2.5-VL (embodied.policy.architectures): Qwen3-VL and Qwen3.5 through every
loop with the tokens their authors intend, and other image-text-to-text architectures in evaluation.

The folders are built from transformers' own config classes (tests/model_folders.py), as a user's checkpoint
would arrive, or by `tiny:qwen3-vl` / `tiny:qwen3.5`."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import model_folders  # noqa: E402

from embodied.config import load_config  # noqa: E402
from embodied.envs.config import Turns
from embodied.policy.architectures import architecture_of  # noqa: E402
from embodied.policy.architectures.qwen2_vl import Qwen2VL  # noqa: E402
from embodied.policy.config import PolicyConfig  # noqa: E402
from embodied.policy.model import (  # noqa: E402
    completion_logprobs,
    encode_prompts,
    generate,
    load,
    load_policy,
    prompt_text,
    repeat_batch,
    select_rows,
)
from embodied.video import Clip, VideoConfig, frame_pixel_cap  # noqa: E402

PPO = str(Path(__file__).parents[1] / "configs" / "recipes" / "ppo.yaml")
PAPO = str(Path(__file__).parents[1] / "configs" / "recipes" / "papo.yaml")

RECORD = {"id": "q", "question": "Is the clip played forward?", "options": ["forward", "reversed"]}


def _clip(frames: int, h: int, w: int, fps: float = 2.0, seed: int = 0) -> Clip:
    rng = np.random.default_rng(seed)
    return Clip(rng.integers(0, 256, (frames, h, w, 3), dtype=np.uint8), fps)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("architectures")
    return {
        name: getattr(model_folders, name)(root / name)
        for name in ("qwen3_vl", "qwen3_vl_moe", "qwen3_5_moe", "llava_onevision", "gemma3")
    }


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    """The `tiny:` folders are built in a temporary cache, not in ~/.cache (restored afterwards)."""
    import os

    old = os.environ.get("EMBODIED_CACHE")
    os.environ["EMBODIED_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("EMBODIED_CACHE", None)
    else:
        os.environ["EMBODIED_CACHE"] = old


@pytest.fixture(scope="module")
def tiny_models():
    """`tiny:qwen3-vl` and `tiny:qwen3.5` (and the Qwen2.5-VL `tiny`), loaded once."""
    return {f: load(PolicyConfig(path=f"tiny:{f}")) for f in ("qwen2.5-vl", "qwen3-vl", "qwen3.5")}


def _reference_grid(clip: Clip, video: VideoConfig, patch: int) -> list[int]:
    """The grid qwen-vl-utils' `fetch_video` gives a decoded video file's frames under the same budget:
    its `smart_resize` on the `patch * 2` grid, frames rounded up to pairs. (Its list-of-frames input resizes
    each frame on a `patch * 4` grid first, so a 112 px frame falls to 64 px on Qwen3-VL: the file path is the
    reference.)"""
    from qwen_vl_utils.vision_process import smart_resize

    n, h, w = clip.frames.shape[:3]
    rh, rw = smart_resize(
        h, w, factor=patch * 2, min_pixels=video.min_pixels, max_pixels=frame_pixel_cap(n, video)
    )
    return [(n + 1) // 2, rh // patch, rw // patch]


@pytest.mark.parametrize("arch, patch", [("qwen2.5-vl", 14), ("qwen3-vl", 16), ("qwen3.5", 16)])
@pytest.mark.parametrize("shape", [(4, 112, 112), (6, 96, 160), (8, 224, 224), (3, 100, 140)])
def test_visual_tokens_match_the_reference_preprocessing(tiny_models, arch, patch, shape):
    """Each architecture's clip gives the grid (and so the visual token count) of qwen-vl-utils at the same
    budget: a 4-frame 112 px clip keeps 16 or more tokens on Qwen3-VL (transformers' own sizing gave 2)."""
    _, processor = tiny_models[arch]
    video, clip = VideoConfig(), _clip(*shape)
    batch = encode_prompts(processor, [{**RECORD, "video": "c.mp4"}], [clip], video)
    assert batch["video_grid_thw"][0].tolist() == _reference_grid(clip, video, patch)
    tokens = int((batch["mm_token_type_ids"] == 2).sum())
    assert tokens == int(batch["video_grid_thw"].prod()) // 4
    if shape == (4, 112, 112):
        assert tokens >= 16


@pytest.mark.parametrize("fps, frames", [(2.0, 4), (1.0, 6), (4.0, 5)])
def test_qwen3_prompt_timestamps_are_the_sampled_frames_times(tiny_models, fps, frames):
    """Qwen3-VL writes each temporal patch's time into the prompt: the mean time of its two sampled frames
    (the clip's own rate, not transformers' 24 fps default)."""
    _, processor = tiny_models["qwen3-vl"]
    clip = _clip(frames, 112, 112, fps)
    batch = encode_prompts(processor, [{**RECORD, "video": "c.mp4"}], [clip], VideoConfig())
    text = processor.tokenizer.decode(batch["input_ids"][0])
    written = [float(t) for t in re.findall(r"<(\d+\.\d) seconds>", text)]
    times = list(clip.timestamps) + [clip.timestamps[-1]] * (frames % 2)  # the last frame pads a pair
    want = [float(f"{(times[i] + times[i + 1]) / 2:.1f}") for i in range(0, len(times), 2)]
    assert written == want and len(written) == int(batch["video_grid_thw"][0, 0])


@pytest.mark.parametrize("arch", ["qwen3-vl", "qwen3.5"])
def test_shared_prefix_equals_a_plain_forward(tiny_models, arch):
    """The grouped path (each prompt run once, its cache repeated: attention keys and values, and Qwen3.5's
    linear-attention states; Qwen3-VL's deepstack features repeated with the visual tokens) gives the
    log-probs and the gradients of one plain pass per row."""
    _assert_shared_prefix_is_plain(*tiny_models[arch])


def _assert_shared_prefix_is_plain(model, processor) -> None:
    records = [{**RECORD, "id": str(i), "video": "c.mp4"} for i in range(2)]
    clips = [_clip(4, 112, 112, seed=1), _clip(6, 96, 128, seed=2)]
    batch = repeat_batch(encode_prompts(processor, records, clips, VideoConfig()), 3)
    ids, mask = generate(model, processor, batch, 6, seeds=list(range(6)))
    m = mask.bool()
    grads = []
    for b in (batch, dict(batch)):
        model.zero_grad()
        lp = completion_logprobs(model, b, ids, mask)
        (lp * mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        grads[-1]["lp"] = lp.detach()
    torch.testing.assert_close(grads[0]["lp"][m], grads[1]["lp"][m], atol=2e-5, rtol=0)
    vision = [n for n in grads[1] if architecture_of(model).is_vision(n)]
    assert vision and set(grads[0]) == set(grads[1])
    for name in set(grads[1]) - {"lp"}:  # the log-probs are compared above, on the completions' tokens
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-4, rtol=1e-3, msg=name)
    model.zero_grad()


MOE = [
    ("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration"),
    # 11 s; Qwen3.5's loops by default: test_qwen3_5_trains_from_the_config_alone
    pytest.param("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, cls", MOE)
def test_a_moe_folder_trains_and_its_shared_prefix_is_plain(folders, dataset, tmp_path, name, cls):
    """The mixture-of-experts variants (Qwen3-VL-30B-A3B's and Qwen3.5-35B-A3B's architectures; 4 experts, 2
    routed per token, at tiny size), from folders the project did not build: the grouped path gives a plain
    pass's log-probs and gradients (experts' included; Qwen3.5's linear-attention states repeated), and eval,
    SFT with LoRA and GRPO's grouped path run from the config alone."""
    from embodied import run

    path = folders[name]
    model, processor = load(PolicyConfig(path=str(path)))
    assert type(model).__name__ == cls
    _assert_shared_prefix_is_plain(model, processor)
    root = f"data.root={dataset}"
    ev = run.eval(_cfg(tmp_path / "e", path, root, "eval.split=test"), progress=False)
    assert ev["n"] == 6 and ev["choice_accuracy"] is not None
    sft = ["sft.steps=2", "sft.batch_size=4", "sft.eval_every=0", "policy.lora_rank=4"]
    run.sft(_cfg(tmp_path / "l", path, root, *sft), progress=False)
    grpo = ["grpo.steps=1", "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.eval_every=0"]
    run.grpo(_cfg(tmp_path / "g", path, root, *grpo), progress=False)
    for d in "lg":
        assert (tmp_path / d / "model" / "config.json").is_file()


def test_rows_of_a_qwen3_batch_keep_their_own_visual_inputs(tiny_models):
    """Rows are split by their grids' tokens: a clip's timestamped blocks count as one video, and a row of
    images and a row of video each keep their own pixels (the batch made of those rows alone)."""
    _, processor = tiny_models["qwen3-vl"]
    video = VideoConfig()
    records = [
        {**RECORD, "id": "a", "video": "a.mp4"},
        {**RECORD, "id": "b", "images": ["0.png", "1.png"]},
        {**RECORD, "id": "c", "video": "c.mp4"},
    ]
    clips = [_clip(4, 112, 112, seed=3), _clip(2, 64, 96, seed=4), _clip(6, 96, 128, seed=5)]
    batch = encode_prompts(processor, records, clips, video)
    picked = select_rows(batch, [2, 0])
    alone = encode_prompts(processor, [records[2], records[0]], [clips[2], clips[0]], video)
    for key in ("video_grid_thw", "pixel_values_videos"):
        assert torch.equal(picked[key], alone[key]), key
    images = select_rows(batch, [1])
    assert images["image_grid_thw"].shape[0] == 2 and "video_grid_thw" not in images


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A tiny arrow-of-time dataset on disk (8 / 4 / 6 clips)."""
    from embodied import run

    root = tmp_path_factory.mktemp("data") / "aot"
    cfg = load_config(
        [], [f"data.root={root}", "data.n_train=8", "data.n_val=4", "data.n_test=6", "data.workers=1"]
    )
    run.generate(cfg, progress=False)
    return root


def _cfg(tmp_path, path, *extra: str, files: tuple[str, ...] = ()):
    return load_config(list(files), [f"policy.path={path}", f"run_dir={tmp_path}", "threads=1", *extra])


@pytest.mark.slow  # 20 s; the same loops on the Qwen3-VL architecture: test_a_moe_folder_trains_... (MoE)
def test_a_qwen3_vl_folder_runs_eval_sft_and_grpo(folders, dataset, tmp_path):
    """A Qwen3-VL folder the project did not build: eval, SFT (with LoRA, gradient checkpointing and a new
    layer) and GRPO (the grouped path, PPO's value head, PAPO's masked video) run from the config alone."""
    from embodied import run

    path, root = folders["qwen3_vl"], f"data.root={dataset}"
    ev = run.eval(_cfg(tmp_path / "e", path, root, "eval.split=test"), progress=False)
    assert ev["n"] == 6 and ev["choice_accuracy"] is not None
    sft = ["sft.steps=2", "sft.batch_size=4", "sft.eval_every=0"]
    run.sft(_cfg(tmp_path / "s", path, root, *sft), progress=False)
    extra = ["policy.lora_rank=4", "policy.gradient_checkpointing=true", "policy.expand_layers=1"]
    run.sft(_cfg(tmp_path / "l", path, root, *sft, *extra), progress=False)
    grpo = ["grpo.steps=1", "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.eval_every=0"]
    run.grpo(_cfg(tmp_path / "g", path, root, *grpo), progress=False)
    run.grpo(_cfg(tmp_path / "p", path, root, *grpo, files=(PPO,)), progress=False)
    run.grpo(_cfg(tmp_path / "v", path, root, *grpo, files=(PAPO,)), progress=False)
    assert "loss/perception" in (tmp_path / "v" / "metrics.jsonl").read_text()
    for d in "slgpv":
        assert (tmp_path / d / "model" / "config.json").is_file()


@pytest.mark.parametrize("name, part", [("llava_onevision", "<video>"), ("gemma3", "<start_of_image>")])
def test_other_architectures_answer_greedily_and_training_refuses_them(folders, examples, name, part):
    """LLaVA-OneVision takes the clip as a video, Gemma 3 as its frames (no video processor), each with its
    own chat template and its processor's own sizes; forced choice (which repeats rows by their grids) is
    reported as not taken, and the training loops refuse the folder in one line before its weights load."""
    from embodied.eval.loop import MCQEval, evaluate

    model, processor = load_policy(folders[name])
    how = MCQEval(batch_size=3, max_new_tokens=4, progress=False)
    result = evaluate(model, processor, examples[:3], VideoConfig(), how)
    assert result["n"] == 3 and all(r["choice"] is None for r in result["predictions"])
    prompt = prompt_text(processor, examples[0].record, len(examples[0].clip.frames))
    assert prompt.count(part) == (1 if part == "<video>" else len(examples[0].clip.frames))
    with pytest.raises(ValueError, match=r"does not train model_type .*the training loops take .*qwen3_vl"):
        load(PolicyConfig(path=str(folders[name])), "grpo")


def _cli(capsys, *args: str) -> tuple[int, str]:
    from embodied.cli import main

    code = main(list(args))
    return code, capsys.readouterr().err


def test_the_cli_refuses_what_it_cannot_load_in_one_line(folders, tmp_path, capsys):
    """A text-only language model, a folder without processor files, an unknown architecture, and a
    model type the loops do not train: each one line naming the folder, no traceback, no hub address."""
    text = model_folders.text_only(tmp_path / "text")
    bare = tmp_path / "bare"
    shutil.copytree(folders["qwen3_vl"], bare)
    for f in bare.glob("*"):
        if "processor" in f.name:
            f.unlink()
    alien = tmp_path / "alien"
    shutil.copytree(folders["qwen3_vl"], alien)
    config = json.loads((alien / "config.json").read_text())
    (alien / "config.json").write_text(json.dumps({**config, "model_type": "no_such_vlm"}))
    cases = [
        ("eval", text, "is not a vision-language model"),
        ("eval", bare, "no processor files"),
        ("eval", alien, "does not know"),
        ("sft", folders["llava_onevision"], "does not train model_type 'llava_onevision'"),
    ]
    for command, folder, why in cases:
        code, err = _cli(
            capsys, command, f"policy.path={folder}", "data.root=/nonexistent", f"run_dir={tmp_path}/r"
        )
        assert code == 1 and why in err and str(folder) in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "huggingface.co" not in err


def test_qwen3_vl_plays_two_turn_episodes(tiny_models, tmp_path):
    """Multi-turn episodes on Qwen3-VL: after a few SFT steps the policy answers, turn 1 executes in MuJoCo
    and fails, turn 2's prompt carries both clips (each its own timestamped video), the trajectory trains,
    and evaluation reports success after each turn."""
    from embodied.config import SFTConfig
    from embodied.data.load import Example
    from embodied.envs import push
    from embodied.eval.env_loop import EnvEval, evaluate_env
    from embodied.rl.episodes import sample_episodes
    from embodied.rl.rewards import routed_rewards
    from embodied.rl.rollout import Sampling
    from embodied.train.sft import train_sft
    from embodied.train.state import Run

    model, processor = load(PolicyConfig(path="tiny:qwen3-vl"))
    episodes = []
    for seed in (3, 4):
        record, frames = push.make_episode(seed, "easy", 64, 64, 4, 2.0)
        episodes.append(Example(record | {"id": f"push-{seed}", "video": f"{seed}.mp4"}, Clip(frames, 2.0)))
    short = "<think></think><answer>0.05</answer>"  # an impulse far too small: the puck stops short
    cfg = SFTConfig(steps=30, batch_size=2, lr=3e-3, eval_every=0, checkpoint_every=0, warmup_steps=0)
    train_sft(cfg, Run(model, processor, episodes, tmp_path, progress=False), target_fn=lambda r: short)
    model.eval()
    sampling = Sampling(2, 12, temperature=0.2)
    ro = sample_episodes(
        model, processor, episodes, VideoConfig(), routed_rewards(), Turns(2), sampling, [1, 2]
    )
    two = (ro.turn == 2).nonzero().flatten().tolist()
    assert two, ro.texts  # the format-trained policy answered, the puck stopped short
    assert ro.batch["video_grid_thw"].shape[0] == 4 + 2 * len(two)
    row = select_rows(ro.batch, [two[0]])
    assert row["video_grid_thw"].shape[0] == 2  # the episode's clip, then turn 1's outcome
    text = processor.tokenizer.decode(row["input_ids"][0][row["attention_mask"][0].bool()])
    assert text.count("<0.2 seconds>") == 2  # both clips' first temporal patch, at their own times
    how = EnvEval(max_new_tokens=12, turns=Turns(2), seed=0)
    res = evaluate_env(model, processor, episodes, VideoConfig(), how)
    assert res["turns"]["per_task"]["push"]["n"] == 2


def test_qwen3_5_trains_from_the_config_alone(dataset, tmp_path):
    """Qwen3.5 (linear-attention layers beside full attention): SFT and GRPO on `tiny:qwen3.5`."""
    from embodied import run

    root = f"data.root={dataset}"
    sft = ["sft.steps=2", "sft.batch_size=4", "sft.eval_every=0"]
    run.sft(_cfg(tmp_path / "s", "tiny:qwen3.5", root, *sft), progress=False)
    grpo = ["grpo.steps=1", "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.eval_every=0"]
    info = run.grpo(_cfg(tmp_path / "g", "tiny:qwen3.5", root, *grpo), progress=False)
    assert info["steps"] == 1 and (tmp_path / "g" / "model" / "config.json").is_file()


def test_a_checkpoint_with_other_patch_sizes_is_sized_on_its_own_grid(tiny_models):
    """The unit of a Qwen3-VL processor is its patch x merge: a checkpoint built with 14 px patches sizes its
    frames on a 28 px grid, as qwen-vl-utils would (the published 16 px gives 32)."""
    import copy

    _, processor = tiny_models["qwen3-vl"]
    other = copy.deepcopy(processor)
    other.video_processor.patch_size = 14
    assert architecture_of(other).unit == 28 and architecture_of(processor).unit == 32
    clip, video = _clip(4, 112, 112), VideoConfig()
    batch = encode_prompts(other, [{**RECORD, "video": "c.mp4"}], [clip], video)
    assert batch["video_grid_thw"][0].tolist() == _reference_grid(clip, video, 14)


class _Moved(Qwen2VL):
    """Qwen2.5-VL with the tokens after a prompt moved `shift` positions on, recording each hook asked."""

    def __init__(self, shift: int):
        self.shift, self.asked = shift, []

    def prompt_positions(self, model, batch):
        self.asked.append("prompt")
        return super().prompt_positions(model, batch)

    def continued_positions(self, start, steps):
        self.asked.append("continued, one step" if isinstance(steps, int) else "continued")
        return super().continued_positions(start + self.shift, steps)


def test_the_grouped_paths_take_their_positions_from_the_architecture(tiny_policy, monkeypatch):
    """An architecture that overrides the position hooks is what the shared prompt pass (groups.py) and the
    grouped sampler (model.py) use: the same hooks give bitwise the same log-probs, moved positions others."""
    from embodied.policy import architectures

    model, processor = tiny_policy
    records = [{**RECORD, "id": str(i), "video": "c.mp4"} for i in range(2)]
    clips = [_clip(4, 112, 112, seed=1), _clip(2, 112, 112, seed=2)]
    batch = repeat_batch(encode_prompts(processor, records, clips, VideoConfig()), 3)
    ids, mask = generate(model, processor, batch, 5, seeds=list(range(6)))
    with torch.no_grad():
        before = completion_logprobs(model, batch, ids, mask)
    stock = architectures.for_model_type
    for shift in (0, 64):
        moved = _Moved(shift)
        pick = lambda t, moved=moved: moved if t == "qwen2_5_vl" else stock(t)  # noqa: E731
        monkeypatch.setattr(architectures, "for_model_type", pick)
        with torch.no_grad():
            after = completion_logprobs(model, batch, ids, mask)
        assert moved.asked == ["prompt", "continued"]
        assert torch.equal(after, before) == (shift == 0)
        generate(model, processor, batch, 3, seeds=list(range(6)))
        assert moved.asked[2:] == ["prompt", "continued, one step", "continued, one step"]
