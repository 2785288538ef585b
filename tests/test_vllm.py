"""The vLLM rollout engine (`rollout.engine=vllm`, embodied/policy/vllm_engine.py) against the Hugging Face
path it replaces, on the tiny base in float32 on this CPU.

Marker `vllm`: these run in `.venv-vllm` (made by scripts/setup_vllm.sh), where vLLM and the framework share
one environment: `.venv-vllm/bin/python -m pytest -m vllm`. One engine serves the module (it starts in about
40 s); each test first syncs it with its own policy, as the trainer does.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from embodied.policy.model import load_policy, resolve_policy_path, vision_token_ids
from embodied.policy.sampling import Draw, HFEngine, group_prompts
from embodied.rl.rewards import mcq_rewards
from embodied.rl.rollout import Sampling, rollout_logprobs, sample_groups
from embodied.train.config import GRPOConfig
from embodied.train.grpo import train_grpo
from embodied.train.state import Run
from embodied.video import VideoConfig

pytestmark = pytest.mark.vllm
TOLERANCE = 1e-4  # the bar; measured agreement is ~1e-6 in float32


@pytest.fixture(scope="module")
def base():
    """The shipped tiny base (Qwen2.5-VL, float32): `(model, processor)`, copied by each test that trains."""
    return load_policy(resolve_policy_path("tiny-base"))


@pytest.fixture(scope="module")
def engine(base):
    try:
        import vllm  # noqa: F401

        from embodied.policy.vllm_engine import VLLMEngine
    except ImportError as err:
        pytest.fail(
            f"vLLM is not in this environment ({err}): scripts/setup_vllm.sh, then .venv-vllm/bin/python"
        )
    return VLLMEngine(*base, max_model_len=2048)


def agreement(engine, model, processor, examples) -> tuple[list[str], list[str], float]:
    """On every prompt of `examples`: the engine's and Hugging Face's greedy answers, and the largest
    |engine - trainer| log-prob over a sampled rollout (two members per prompt, two temperatures)."""
    video = VideoConfig()
    prompts = group_prompts(
        processor, [e.record for e in examples], [e.clip for e in examples], video, "cpu", 1
    )
    ours, theirs = (
        engine.sample(prompts, Draw(24)).texts,
        HFEngine(model, processor).sample(prompts, Draw(24)),
    )
    sampling = Sampling(2, 16, temperatures=[0.7, 1.3])
    ro = sample_groups(
        model, processor, examples, video, mcq_rewards(), sampling, list(range(len(examples))), engine=engine
    )
    trainer = rollout_logprobs(model, ro, suppress=vision_token_ids(processor))
    gap = float(((trainer - ro.engine_logprobs).abs() * ro.mask).max())
    return ours, theirs.texts, gap


def test_prompt_ids_and_greedy_answers_equal_hugging_face(engine, base, examples):
    """Video prompts: the engine's prompt ids are the trainer's (it refuses a request otherwise), its greedy
    tokens are Hugging Face's on every prompt, end-of-turn stops them, and no placeholder is ever sampled."""
    model, processor = base
    engine.sync(model)
    prompts = group_prompts(
        processor, [e.record for e in examples], [e.clip for e in examples], VideoConfig(), "cpu", 1
    )
    ours, theirs = engine.sample(prompts, Draw(48)), HFEngine(model, processor).sample(prompts, Draw(48))
    assert ours.texts == theirs.texts
    for r in range(len(examples)):
        assert torch.equal(ours.ids[r][ours.mask[r].bool()], theirs.ids[r][theirs.mask[r].bool()])
    assert torch.equal(ours.truncated, theirs.truncated)  # the tiny base captions on past 48 tokens
    assert processor.tokenizer.convert_tokens_to_ids("<|im_end|>") in engine.eos  # a stop id
    drawn = engine.sample(prompts, Draw(32, torch.full((len(examples),), 2.0), list(range(len(examples)))))
    assert not torch.isin(drawn.ids, torch.tensor(vision_token_ids(processor))).any()  # hot, yet never
    with pytest.raises(ValueError, match=r"temperatures up to 2 \(vLLM's bound\)"):
        engine.sample(prompts, Draw(4, 2.5))


def test_sampled_log_probs_equal_the_trainers(engine, base, examples):
    model, processor = base
    engine.sync(model)
    ours, theirs, gap = agreement(engine, model, processor, examples[:8])
    assert ours == theirs and gap < TOLERANCE, gap


def test_a_quickstart_sized_seeded_rollout_runs_and_matches(engine, base, examples):
    """32 prompts x 4 seeded rows in one call, the quickstart's rollout: a prefill split across scheduler
    steps rewinds its row's generator, which a CPU generator cannot (this crashed before chunked prefill was
    turned off); every row's log-probs still match the trainer's."""
    from embodied.rl.rollout import engine_metrics

    model, processor = base
    engine.sync(model)
    prompts = (examples * 2)[:32]
    ro = sample_groups(
        model,
        processor,
        prompts,
        VideoConfig(),
        mcq_rewards(),
        Sampling(4, 16),
        list(range(32)),
        engine=engine,
    )
    assert ro.ids.shape[0] == 128
    assert engine_metrics(model, processor, ro)["rollout/logprob_diff_max"] < TOLERANCE


def _train(engine, base, examples, tmp_path, steps: int = 3):
    model, processor = copy.deepcopy(base[0]), base[1]
    engine.sync(model)
    # the tiny base never answers in the format (every reward 0): the entropy bonus moves the weights anyway
    cfg = GRPOConfig(steps=steps, prompts_per_step=4, group_size=4, max_new_tokens=16, lr=1e-3, kl_coef=0.0)
    cfg.entropy_coef = 0.05
    cfg.log_every, cfg.checkpoint_every = 1, 0
    train_grpo(cfg, Run(model, processor, examples, tmp_path, progress=False, engine=engine))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return model, processor, rows


def test_after_grpo_steps_the_engine_answers_as_the_trained_weights_do(engine, base, examples, tmp_path):
    """Synced after every step: every logged step names its sync time and policy version and measured the
    engine against the trainer at the sampled weights; afterwards the engine's greedy answers are Hugging
    Face's on the trained weights for every prompt of the split, and its log-probs the trainer's."""
    before = copy.deepcopy(base[0].state_dict())
    model, processor, rows = _train(engine, base, examples, tmp_path)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # it trained
    assert [r["rollout/policy_version"] for r in rows] == [engine.version - k for k in (3, 2, 1)]
    for r in rows:
        assert r["time/sync"] > 0 and r["rollout/logprob_diff_max"] < TOLERANCE
        assert abs(r["rollout/importance_ratio"] - 1) < TOLERANCE
        assert r["rollout/is_masked_frac"] == 0  # the default correction (sequence_mask, cap 3) keeps all
    ours, theirs, gap = agreement(engine, model, processor, examples)
    assert ours == theirs and gap < TOLERANCE, gap


def test_a_lora_policy_is_synced_with_its_adapters_merged(engine, base, examples, tmp_path):
    """LoRA (rank 4, the adapters trained by GRPO's entropy bonus): each sync sends every weight with the
    adapters merged, as TRL's colocated sync does; afterwards the engine answers as the adapted policy."""
    from embodied.policy.lora import adapters_are_zero, apply_lora, lora_layers

    model = apply_lora(copy.deepcopy(base[0]), rank=4, alpha=8)
    engine.sync(model)
    cfg = GRPOConfig(steps=2, prompts_per_step=4, group_size=4, max_new_tokens=16, lr=3e-2, kl_coef=0.0)
    cfg.entropy_coef, cfg.log_every, cfg.checkpoint_every = 0.05, 1, 0
    train_grpo(cfg, Run(model, base[1], examples, tmp_path, progress=False, engine=engine))
    assert not adapters_are_zero(lora_layers(model))  # the adapters trained
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["rollout/logprob_diff_max"] < TOLERANCE for r in rows)
    ours, theirs, gap = agreement(engine, model, base[1], examples[:8])
    assert ours == theirs and gap < TOLERANCE, gap
    engine.sync(base[0])  # back to the base: a stale adapter would now show
    ours, _, gap = agreement(engine, base[0], base[1], examples[:8])
    assert gap < TOLERANCE, gap


def test_a_masked_head_is_masked_in_the_engine_too(base, examples):
    """A `random:` policy's output layer is masked past its tokenizer by a forward hook vLLM never runs; the
    engine samples only below the limit, so its log-probs are the trainer's (at real size, before this, the
    engine sampled masked ids and the gap was 9,980 nats)."""
    from embodied.policy.random_weights import mask_undecodable
    from embodied.policy.vllm_engine import VLLMEngine

    model = copy.deepcopy(base[0])
    assert mask_undecodable(model, 600) == 600
    engine = VLLMEngine(model, base[1], max_model_len=2048)  # its own: the config names the limit
    assert max(engine.allowed) < 600
    prompts = group_prompts(
        base[1], [e.record for e in examples[:4]], [e.clip for e in examples[:4]], VideoConfig(), "cpu", 2
    )
    drawn = engine.sample(prompts, Draw(24, 2.0, list(range(8))))
    assert int(drawn.ids[drawn.mask.bool()].max()) < 600
    ours, theirs, gap = agreement(engine, model, base[1], examples[:4])
    assert ours == theirs and gap < TOLERANCE, gap


class SkipsSyncs:
    """The real engine, but the syncs numbered `skip` (1: the one before training) never reach it: the stale
    engine the checks above must catch."""

    def __init__(self, engine, skip: set[int]):
        self.engine, self.skip, self.calls = engine, skip, 0
        self.name = engine.name

    def sample(self, prompts, draw):
        return self.engine.sample(prompts, draw)

    def sync(self, model):
        self.calls += 1
        return {} if self.calls in self.skip else self.engine.sync(model)


def test_a_skipped_sync_fails_the_checks(engine, base, examples, tmp_path):
    """Skipping the sync after step 2 (and every later one): step 3's logged drift and the agreement after
    training both fail the bounds the synced run meets; one sync repairs the engine."""
    model, processor, rows = _train(SkipsSyncs(engine, {3, 4}), base, examples, tmp_path)
    assert rows[1]["rollout/logprob_diff_max"] < TOLERANCE  # step 2 still sampled in sync
    assert rows[2]["rollout/logprob_diff_max"] > 10 * TOLERANCE, rows[2]  # step 3: a stale engine
    assert abs(rows[2]["rollout/is_ratio_mean"] - 1) > 0.01, rows[2]  # the correction's ratio sees it
    ours, theirs, gap = agreement(engine, model, processor, examples)
    assert gap > 10 * TOLERANCE, gap
    engine.sync(model)
    ours, theirs, gap = agreement(engine, model, processor, examples)
    assert ours == theirs and gap < TOLERANCE, gap


def test_a_later_turns_conversation_through_the_engine_equals_hugging_face(engine, base):
    """Multi-turn: turn 2's prompt is the conversation with the episode's clip and the first answer's
    outcome clip, two videos in one prompt; the engine takes the trainer's ids and answers as Hugging Face."""
    from embodied.data.load import Example
    from embodied.envs import push
    from embodied.envs.config import Turns
    from embodied.rl.episodes import play
    from embodied.rl.rewards import routed_rewards
    from embodied.video import Clip

    model, processor = base
    engine.sync(model)
    episodes = []
    for seed in (3, 4):
        record, frames = push.make_episode(seed, "easy", 56, 56, 4, 2.0)
        episodes.append(Example(record | {"id": f"push-{seed}", "video": f"{seed}.mp4"}, Clip(frames, 2.0)))
    short = "<think></think><answer>0.05</answer>"  # too small an impulse: turn 1 fails, turn 2 follows
    first = ([short] * 2, [{"reward/total": -1.0, "reward/success": 0.0}] * 2)
    video, sampling = VideoConfig(), Sampling(max_new_tokens=12)
    args = (model, processor, episodes, video, routed_rewards(), Turns(2), sampling)
    ours, theirs = play(*args, first=first, engine=engine), play(*args, first=first)
    assert len(ours.turns) == 2 and ours.turns[1].batch["video_grid_thw"].shape[0] == 4  # 2 videos a row
    assert ours.turns[1].texts == theirs.turns[1].texts


def test_expert_iteration_samples_through_the_engine_and_syncs_after_each_round(
    engine, base, examples, tmp_path
):
    """`embodied expert` with the engine: each round's answers come from it (kept by a reward with spread:
    the parity of the answer's length) and the round's fine-tuning is synced before the next round samples."""
    from embodied.train.config import ExpertConfig, SFTConfig
    from embodied.train.expert import train_expert

    def parity(texts, records):
        return [{"reward/total": float(len(t) % 2), "reward/accuracy": float(len(t) % 2)} for t in texts]

    model = copy.deepcopy(base[0])
    engine.sync(model)
    cfg = ExpertConfig(
        rounds=2, prompts_per_round=4, samples=4, sft_steps=3, batch_size=4, lr=1e-3, keep="best"
    )
    run = Run(model, base[1], examples, tmp_path, progress=False, reward_fn=parity, engine=engine)
    info = train_expert(cfg, SFTConfig(warmup_steps=0), run, max_new_tokens=160)  # whole captions end
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert info["answers_scored"] == 2 * 4 * 4 and info["kept"] > 0
    assert [r["step"] for r in rows if r.get("time/sync", 0) > 0] == [1, 2]
    ours, theirs, gap = agreement(engine, model, base[1], examples[:4])
    assert ours == theirs and gap < TOLERANCE, gap


# The command-line tests below build engines of their own, for the same tiny base: each reuses the module's
# live engine (`vllm_engine._LIVE`; vLLM's parallel groups are process-wide) and syncs its own weights.


def test_embodied_eval_through_the_engine_gives_hugging_faces_greedy_predictions(tmp_path):
    """`embodied eval rollout.engine=vllm` on the tiny base: the greedy prediction of every question equals
    the Hugging Face engine's, and its sampled answers (pass@k) come through the engine too."""
    from embodied.cli import main
    from embodied.config import Config
    from embodied.data.build import generate_dataset

    data = Config().data
    data.root, data.n_train, data.n_val, data.n_test, data.workers = str(tmp_path / "aot"), 0, 0, 8, 1
    generate_dataset(data, progress=False)
    results = {}
    for name in ("hf", "vllm"):
        args = [f"data.root={data.root}", f"run_dir={tmp_path / name}", f"rollout.engine={name}"]
        assert main(["eval", "-q", *args, "eval.max_new_tokens=32", "eval.samples=2"]) == 0
        results[name] = json.loads((tmp_path / name / "eval_test.json").read_text())
    hf, vl = ({p["id"]: p for p in r["predictions"]} for r in (results["hf"], results["vllm"]))
    assert len(hf) == 8 and hf.keys() == vl.keys()
    assert all(vl[q]["response"] == hf[q]["response"] for q in hf)
    assert results["vllm"]["settings"]["engine"] == "vllm" and "engine" not in results["hf"]["settings"]
    assert results["vllm"]["accuracy"] == results["hf"]["accuracy"]


def test_embodied_eval_of_interactive_episodes_through_the_engine_equals_hugging_face(tmp_path):
    """`embodied eval rollout.engine=vllm` on push episodes (`env.turns=2`): every greedy answer and its
    simulated terms equal the Hugging Face engine's. The tiny base's answers do not parse, so each episode
    ends at turn 1; a later turn's two-video conversation is checked above."""
    from embodied.cli import main

    root = tmp_path / "push"
    args = ["generate", "--episodes", "env.tasks=[push]", f"env.root={root}", "env.n_train=0", "env.n_test=4"]
    assert main([*args, "env.workers=0", "-q"]) == 0
    results = {}
    for name in ("hf", "vllm"):
        common = [f"data.root={root}", "eval.split=test", "env.turns=2", "eval.max_new_tokens=24", "-q"]
        assert main(["eval", *common, f"run_dir={tmp_path / name}", f"rollout.engine={name}"]) == 0
        results[name] = json.loads((tmp_path / name / "eval_test.json").read_text())
    hf, vl = ({p["id"]: p for p in r["predictions"]} for r in (results["hf"], results["vllm"]))
    assert len(hf) == 4 and hf.keys() == vl.keys()
    for q in hf:
        assert json.dumps(vl[q].get("turns"), sort_keys=True) == json.dumps(
            hf[q].get("turns"), sort_keys=True
        )
        assert vl[q]["response"] == hf[q]["response"]
    assert results["vllm"]["success"] == results["hf"]["success"]


# Qwen3-VL and Qwen3.5: a video's frames each carry a timestamp and a vision start/end pair of their own,
# which vLLM writes again from the video's metadata; the engine sends each video folded to one placeholder.


@pytest.fixture(scope="module")
def qwen3_vl():
    """The shipped tiny Qwen3-VL base (float32) and a vLLM engine on it."""
    from embodied.policy.vllm_engine import VLLMEngine

    model, processor = load_policy(resolve_policy_path("tiny-base-qwen3-vl"))
    return model, processor, VLLMEngine(model, processor, max_model_len=2048)


def engine_prompt_ids(engine, prompts, row: int) -> list[int]:
    """The prompt ids vLLM itself makes of row `row`'s request (its own expansion of each video)."""
    from vllm import SamplingParams

    request, _ = engine.request(prompts, row)
    (out,) = engine.llm.generate([request], SamplingParams(max_tokens=1), use_tqdm=False)
    return list(out.prompt_token_ids)


def scored_prompt_ids(ro, row: int) -> list[int]:
    """The prompt ids the update scores for rollout row `row` (its rows of the rollout's batch)."""
    from embodied.policy.model import select_rows

    sub = select_rows(ro.batch, [row])
    return sub["input_ids"][0][sub["attention_mask"][0].bool()].tolist()


def test_qwen3_vl_video_prompt_ids_the_update_scores_are_the_engines(qwen3_vl, examples):
    """A Qwen3-VL video prompt: the ids vLLM builds (its own timestamps and frame markers) equal the ids the
    update scores, row by row of a GRPO rollout; greedy answers equal Hugging Face's and sampling log-probs
    the trainer's (float32, measured 4e-6)."""
    model, processor, engine = qwen3_vl
    engine.sync(model)
    ro = sample_groups(
        model,
        processor,
        examples[:4],
        VideoConfig(),
        mcq_rewards(),
        Sampling(2, 16),
        [0, 1, 2, 3],
        engine=engine,
    )
    prompts = group_prompts(
        processor, [e.record for e in examples[:4]], [e.clip for e in examples[:4]], VideoConfig(), "cpu", 2
    )
    for row in range(8):
        ids = engine_prompt_ids(engine, prompts, row)
        assert ids == scored_prompt_ids(ro, row)
    text = processor.tokenizer.decode(ids)
    assert text.count(" seconds>") == 2 and text.count("<|vision_start|>") == 3  # 2 frames' pairs + outer
    ours, theirs, gap = agreement(engine, model, processor, examples[:8])
    assert ours == theirs and gap < TOLERANCE, gap


def test_qwen3_vl_after_grpo_steps_the_engine_answers_as_the_trained_weights_do(qwen3_vl, examples, tmp_path):
    model, processor, engine = qwen3_vl
    model, _, rows = _train(engine, (model, processor), examples, tmp_path, steps=2)
    assert all(r["rollout/logprob_diff_max"] < TOLERANCE for r in rows)
    ours, theirs, gap = agreement(engine, model, processor, examples[:8])
    assert ours == theirs and gap < TOLERANCE, gap


def test_qwen3_5_prompt_ids_equal_and_bfloat16_drift_is_bounded(examples, tmp_path):
    """Qwen3.5 (linear-attention layers): vLLM's CPU kernels take bfloat16 and head dims of 64 and up, so the
    tiny model is built wider (linear head dim 64). The prompt ids equal the trainer's row by row; the
    sampling log-probs differ by bfloat16's rounding (measured max 0.022), not by a different prompt."""
    from embodied.policy.tiny import TinySpec, build_tiny_policy
    from embodied.policy.vllm_engine import VLLMEngine

    spec = TinySpec(text_hidden=256, text_heads=2, text_kv_heads=2)
    path = build_tiny_policy(tmp_path / "q35", spec, architecture="qwen3.5")
    model, processor = load_policy(path, dtype="bfloat16")
    engine = VLLMEngine(model, processor, max_model_len=2048)
    ro = sample_groups(
        model,
        processor,
        examples[:3],
        VideoConfig(),
        mcq_rewards(),
        Sampling(2, 16, temperatures=[0.7, 1.3]),
        [0, 1, 2],
        engine=engine,
    )
    prompts = group_prompts(
        processor, [e.record for e in examples[:3]], [e.clip for e in examples[:3]], VideoConfig(), "cpu", 2
    )
    assert all(engine_prompt_ids(engine, prompts, r) == scored_prompt_ids(ro, r) for r in range(6))
    trainer = rollout_logprobs(model, ro, suppress=vision_token_ids(processor))
    assert float(((trainer.float() - ro.engine_logprobs).abs() * ro.mask).max()) < 0.1


def test_what_vllm_cannot_run_here_is_refused_in_one_line(monkeypatch):
    """A float32 Qwen3.5 on a CPU (vLLM's linear-attention kernels are bfloat16 only), and an architecture
    whose prompts are not checked against vLLM's: refused before an engine starts."""
    from embodied.policy.architectures import Architecture
    from embodied.policy.config import PolicyConfig
    from embodied.policy.model import load
    from embodied.policy.vllm_engine import VLLMEngine, check_architecture

    model, processor = load(PolicyConfig(path="tiny:qwen3.5"))
    with pytest.raises(ValueError, match=r"bfloat16 with head dims of 64 and up, not float32 with \[16\]"):
        VLLMEngine(model, processor)

    class Other(Architecture):
        name = "other"

    monkeypatch.setattr("embodied.policy.vllm_engine.architecture_of", lambda processor: Other())
    with pytest.raises(ValueError, match=r"other prompts are not checked against vLLM's"):
        check_architecture(processor)


def test_bench_rollout_times_both_engines_side_by_side(tmp_path):
    """`embodied bench rollout` at tiny size: both engines sample every round (order alternated), the
    engine is synced before each of its groups and its tokens agree with the trainer's, and the ratio is
    reported against the target."""
    from embodied.cli import main

    sizes = ["bench.rollout_frames=4", "bench.rollout_size=112", "bench.rollout_group=2"]
    rest = ["bench.rollout_tokens=8", "bench.rounds=2", "bench.warmup=1", "policy.path=tiny-base"]
    assert main(["bench", "rollout", "-q", *sizes, *rest, f"run_dir={tmp_path}"]) == 0
    result = json.loads((tmp_path / "bench_rollout.json").read_text())
    assert [list(r) for r in result["rounds"]] == [["hf", "vllm"], ["vllm", "hf"]]
    vllm = result["engines"]["vllm"]
    assert vllm["sync_s"] > 0 and vllm["logprob_diff_max"] < TOLERANCE
    assert result["engines"]["hf"]["tokens_per_group"] > 0 and result["startup_s"]["vllm"] > 0
    assert result["vllm_over_hf"] > 0 and result["target"]["vllm_over_hf"] == 0.5
    assert result["visual_tokens"] == 32 and "environment" in result


def test_quickstart_through_the_engine_logs_its_syncs_and_drift(tmp_path, monkeypatch):
    """`embodied quickstart rollout.engine=vllm`, shortened: its GRPO rows carry the sync time, the policy
    version and the engine-trainer drift within the bound, and it ends with a model and a summary."""
    from embodied.cli import main

    monkeypatch.chdir(tmp_path)
    sizes = ["data.n_train=16", "data.n_val=4", "data.n_test=6", "data.workers=0", "sft.steps=6"]
    steps = ["sft.batch_size=8", "sft.eval_every=0", "grpo.steps=2", "grpo.prompts_per_step=2"]
    rest = ["grpo.group_size=4", "grpo.log_every=1", "eval.max_new_tokens=16", "quickstart.grpo_eval_every=1"]
    assert main(["quickstart", "-q", *sizes, *steps, *rest, "rollout.engine=vllm"]) == 0
    out = tmp_path / "runs" / "quickstart"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if r["stage"] == "grpo" and "rollout/logprob_diff" in r]
    versions = [r["rollout/policy_version"] for r in grpo]
    assert len(versions) == 2 and versions[1] == versions[0] + 1  # a sync after step 1
    assert all(r["time/sync"] > 0 and r["rollout/logprob_diff_max"] < TOLERANCE for r in grpo)
    assert (out / "grpo_model" / "model.safetensors").is_file() and (out / "summary.json").is_file()
