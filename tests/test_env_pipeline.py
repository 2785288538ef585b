"""Interactive episodes as a dataset, scored policies, rollout videos, and the experiment's reward routing."""

from __future__ import annotations

import pytest

from embodied.data.episodes import generate_episodes, matches
from embodied.data.load import load_examples
from embodied.envs import push
from embodied.envs.config import EnvConfig
from embodied.envs.evaluate import evaluate_env, rollout_video
from embodied.rl.rewards import routed_rewards
from embodied.video import VideoConfig, read_video


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    cfg = EnvConfig(root=str(tmp_path_factory.mktemp("env")), n_train=1, n_test=1)
    manifest = generate_episodes(cfg, progress=False)
    assert manifest["counts"]["test"] == {"carry": {"easy": 1}, "place": {"easy": 1}, "push": {"easy": 1}}
    assert matches(cfg) and not matches(EnvConfig(root=cfg.root, n_train=2, n_test=1))
    examples, skipped = load_examples(cfg.root, "test")
    assert not skipped and len(examples) == 3
    return examples


def test_episodes_load_like_mcq_datasets(episodes):
    for ex in episodes:
        assert ex.clip.frames.shape == (4, 112, 112, 3) and ex.clip.fps == 2.0
        assert ex.record["answer"] == "" and ex.record["meta"]["interactive"]


def test_evaluate_env_scores_policy_answers(tiny_policy, episodes):
    model, processor = tiny_policy
    result = evaluate_env(model, processor, episodes, VideoConfig(), max_new_tokens=8)
    assert result["n"] == 3 and set(result["per_task"]) == {"place", "carry", "push"}
    # The untrained tiny model writes no parseable action: nothing executes, all is counted.
    assert result["unparseable"] == 1.0 and result["success"] == 0.0
    assert all("reward/total" in p["terms"] for p in result["predictions"])


def test_rollout_video_shows_answer_and_outcome(episodes, tmp_path):
    ex = next(e for e in episodes if e.record["task"] == "push")
    j = push.good_action(ex.record)
    text = f"<think></think><answer>{j:.3f}</answer>"
    terms = rollout_video(ex.record, ex.clip.frames, text, tmp_path / "a.mp4")
    assert terms["reward/success"] == 1
    clip = read_video(tmp_path / "a.mp4", fps=10.0, max_frames=1000)
    assert clip.frames.shape[1:] == (336, 336, 3) and len(clip.frames) > 4 * 5  # the clip, then the physics
    terms = rollout_video(ex.record, ex.clip.frames, "no idea", tmp_path / "b.mp4")
    assert terms["reward/unparseable"] == 1 and (tmp_path / "b.mp4").stat().st_size > 0


def test_routed_reward_scores_each_record_by_its_kind(episodes):
    mcq = {"id": "q", "task": "arrow_of_time", "answer": "A", "options": ["forward", "reversed"]}
    env = next(e.record for e in episodes if e.record["task"] == "push")
    j = push.good_action(env)
    texts = ["<think></think><answer>A</answer>", f"<think></think><answer>{j:.3f}</answer>"]
    terms = routed_rewards()(texts, [mcq, env])
    assert terms[0] == {"reward/accuracy": 1.0, "reward/format": 1.0, "reward/total": 1.5}
    assert terms[1]["reward/success"] == 1 and "reward/accuracy" not in terms[1]


@pytest.mark.slow
def test_env_feedback_experiment_end_to_end(tmp_path):
    """The whole experiment at toy size: data, start, three arms, table, plots and videos."""
    from embodied.config import load_config
    from embodied.experiments.env_feedback import run

    overrides = [
        f"data.root={tmp_path}/mcq", "data.n_train=40", "data.n_val=4", "data.n_test=20", "data.workers=0",
        "sft.steps=10", "sft.batch_size=8", "grpo.steps=2", f"env.root={tmp_path}/env", "env.n_train=6",
        "env.n_test=4", "env.feedback.format_steps=5", "env.feedback.eval_mcq=20",
    ]  # fmt: skip
    cfg = load_config("configs/experiment_env_feedback.yaml", overrides)
    summary = run(cfg, tmp_path / "run", progress=False)
    assert set(summary["stages"]) == {"start", "mcq", "sim", "mixed"}
    for name in ("results.md", "results.json", "results.png", "reward_curves.png"):
        assert (tmp_path / "run" / name).stat().st_size > 0
    assert len(list((tmp_path / "run" / "videos").glob("*.mp4"))) == 4 * 3
