"""Interactive episodes as a dataset, scored policies, rollout videos, and the experiment's reward routing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embodied.data.episodes import ensure_episodes, generate_episodes, matches
from embodied.data.load import Example, load_examples
from embodied.envs import push
from embodied.envs.config import EnvConfig
from embodied.eval.env_loop import EnvEval, evaluate_env
from embodied.eval.env_video import rollout_video
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


def test_ensure_episodes_generates_what_is_missing_and_reuses_what_matches(tmp_path):
    cfg = EnvConfig(root=str(tmp_path / "env"), tasks=["place"], n_train=0, n_test=1)
    ensure_episodes(cfg, progress=False)
    manifest = Path(cfg.root) / "manifest.json"
    made = manifest.stat().st_mtime_ns
    ensure_episodes(cfg, progress=False)  # the same config: nothing is written again
    assert manifest.stat().st_mtime_ns == made
    more = EnvConfig(root=cfg.root, tasks=["place"], n_train=0, n_test=2)
    ensure_episodes(more, progress=False)  # another config: generated anew
    assert matches(more) and len(load_examples(cfg.root, "test")[0]) == 2


def test_episodes_load_like_mcq_datasets(episodes):
    for ex in episodes:
        assert ex.clip.frames.shape == (4, 112, 112, 3) and ex.clip.fps == 2.0
        assert ex.record["answer"] == "" and ex.record["meta"]["interactive"]


def test_evaluate_env_scores_policy_answers(tiny_policy, episodes):
    model, processor = tiny_policy
    result = evaluate_env(model, processor, episodes, VideoConfig(), EnvEval(max_new_tokens=8))
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
    mcq = {"id": "q", "family": "arrow_of_time", "answer": "A", "options": ["forward", "reversed"]}
    env = next(e.record for e in episodes if e.record["task"] == "push")
    j = push.good_action(env)
    texts = ["<think></think><answer>A</answer>", f"<think></think><answer>{j:.3f}</answer>"]
    terms = routed_rewards()(texts, [mcq, env])
    assert terms[0] == {"reward/accuracy": 1.0, "reward/format": 1.0, "reward/total": 1.5}
    assert terms[1]["reward/success"] == 1 and "reward/accuracy" not in terms[1]


@pytest.mark.slow
def test_env_feedback_experiment_end_to_end(tmp_path):
    """The whole experiment at toy size: data, benchmark, start, four arms, two seeds, test-time compute,
    tables, plots and videos; a rerun reuses the finished seeds."""
    from embodied.config import load_config
    from embodied.experiments.config import EnvFeedbackRun
    from embodied.experiments.env_feedback import run

    overrides = [
        f"data.root={tmp_path}/mcq", "data.n_train=40", "data.n_val=4", "data.n_test=20", "data.workers=0",
        "sft.steps=4", "sft.batch_size=8", "grpo.steps=2", "grpo.prompts_per_step=4",
        f"env.root={tmp_path}/env", "env.n_train=6", "env.n_test=4", "env_feedback.seeds=[0,1]",
        "env_feedback.eval_mcq=20", "env_feedback.benchmark_n_test=16", "env_feedback.test_time_samples=2",
        "env_feedback.test_time_k=[1,2]", "expert.rounds=1", "expert.prompts_per_round=4", "expert.samples=2",
        "expert.sft_steps=2", "expert.batch_size=4", "env.workers=0",
        "env_feedback.arms=[mcq,sim,mixed,expert]",
    ]  # fmt: skip
    cfg = load_config("configs/experiment_env_feedback.yaml", overrides, schema=EnvFeedbackRun)
    cfg.env_feedback.benchmark = str(tmp_path / "bench.yaml")
    spec = Path("configs/physics_bench.yaml").read_text()
    (tmp_path / "bench.yaml").write_text(spec.replace("data/benchmarks/physics_v1", f"{tmp_path}/bench"))
    summary = run(cfg, tmp_path / "run", progress=False)
    assert set(summary["stages"]) == {"start", "mcq", "sim", "mixed", "expert"}
    assert [r["seed"] for r in summary["seeds"]] == [0, 1]
    for name in ("results.md", "results.json", "results.png", "reward_curves.png", "test_time.png"):
        assert (tmp_path / "run" / name).stat().st_size > 0
    assert len(list((tmp_path / "run" / "videos").glob("*.mp4"))) == 4 * 3
    text = (tmp_path / "run" / "results.md").read_text()
    assert "best constant answer" in text and "best-of-2" in text and "benchmark, all" in text
    assert "Paired by seed" in text
    pairs = {"mcq - start", "sim - start", "mixed - start", "expert - start", "expert - sim"}
    assert set(summary["paired"]) == pairs
    assert set(summary["provenance"]) == {"version", "code", "weights", "stack"}
    again = run(cfg, tmp_path / "run", progress=False)  # every stage reused, same figures
    same = json.dumps(again["stages"], sort_keys=True) == json.dumps(summary["stages"], sort_keys=True)
    assert same  # compared as text: an undefined correlation is NaN, and NaN != NaN


def test_paired_figures_difference_each_arm_from_its_start_by_seed():
    from embodied.experiments.env_report import paired_figures, paired_markdown

    def stage(success, acc, bench):
        env = {"push": {"success": success}}
        return {"env": env, "mcq": {"accuracy": acc, "bench": bench, "bench_per_family": {"fam": bench}}}

    figures = {
        "start": stage([0.1, 0.2, 0.3], [0.5, 0.5, 0.5], [0.3, 0.3, 0.3]),
        "sim": stage([0.4, 0.4, 0.6], [0.5, 0.6, 0.4], [0.3, 0.3, 0.3]),
        "expert": stage([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.4, 0.3, 0.2]),
    }
    paired = paired_figures(figures)
    assert list(paired) == ["sim - start", "expert - start", "expert - sim"]
    d = paired["sim - start"]["push: success"]
    assert d["per_seed"] == pytest.approx([0.3, 0.2, 0.3])
    mean, lo, hi = d["mean_t95"]
    assert mean == pytest.approx(0.8 / 3) and 0 < lo < mean < hi  # consistent gains: the interval excludes 0
    assert paired["sim - start"]["MCQ: arrow of time (test)"]["mean_t95"][1] < 0  # +-0.1 around 0: no effect
    assert paired["expert - sim"]["push: success"]["per_seed"] == pytest.approx([0.1, 0.1, -0.1])
    assert set(paired["expert - start"]) == {
        "push: success", "MCQ: arrow of time (test)", "MCQ: benchmark, all", "MCQ: benchmark, fam"
    }  # fmt: skip
    text = "\n".join(paired_markdown(paired, 3))
    assert "| push: success | **+0.267 [+" in text and "| MCQ: benchmark, all | +0.000 [+0.00, +0.00]" in text
    assert paired_figures({"start": figures["start"]}) == {}


def test_random_answers_are_well_formed_and_in_range(episodes):
    import numpy as np

    from embodied.envs import random_answer, task

    rng = np.random.default_rng(0)
    for ex in episodes:
        mod = task(ex.record["task"])
        answers = [random_answer(ex.record, rng) for _ in range(50)]
        actions = [mod.parse_action(a) for a in answers]
        assert None not in actions, answers
        assert len({repr(a) for a in actions}) > 3  # a spread, not one constant


def test_env_reward_reuses_outcomes_exactly(episodes):
    from embodied.envs import reward as envs_reward

    rec = next(e.record for e in episodes if e.record["task"] == "carry")
    texts = ["<answer>12, 0.25</answer>", "<answer>12, 0.25</answer>", "<answer>3, 0.2</answer>"]
    envs_reward.clear_outcome_cache()
    first = envs_reward.env_reward(texts, [rec] * 3)
    assert first[0] == first[1] and envs_reward.cached_outcomes() == 2  # the repeated answer simulated once
    cached = envs_reward.env_reward(texts[:1], [rec])
    envs_reward.clear_outcome_cache()
    fresh = envs_reward.env_reward(texts[:1], [rec])
    assert cached == fresh == first[:1]


def test_success_outscores_every_failure(episodes):
    """best-of-N keeps the highest `reward/total`: that is a success whenever one was sampled."""
    import numpy as np

    from embodied.envs import answer_text, task
    from embodied.envs.reward import env_reward

    rng = np.random.default_rng(1)
    for ex in episodes:
        name = ex.record["task"]
        texts = [answer_text(name, a) for a in task(name).probe_actions(ex.record, rng, 10)]
        terms = env_reward(texts, [ex.record] * len(texts))
        wins = [t["reward/total"] for t in terms if t["reward/success"]]
        losses = [t["reward/total"] for t in terms if not t["reward/success"]]
        if wins and losses:
            assert min(wins) > max(losses), name


def test_vote_action():
    from embodied.eval.env_stats import vote_action

    assert vote_action("place", [0, 1, None, 1]) == 1
    assert vote_action("place", [3, 1]) == 3  # a tie goes to the answer sampled first
    assert vote_action("carry", [(1.0, 0.1), (3.0, 0.3), None, (2.0, 0.5)]) == (2.0, 0.3)
    assert vote_action("push", [0.2, 0.9, 0.4]) == 0.4
    assert vote_action("push", [None, None]) is None


def test_test_time_compute_by_hand():
    from embodied.eval.env_stats import test_time_compute

    rows = [
        {"task": "place", "sampled": [{"success": s} for s in (1, 0, 0, 0)], "vote@1": 1.0, "vote@4": 0.0},
        {"task": "push", "sampled": [{"success": s} for s in (0, 0, 0, 0)], "vote@1": 0.0, "vote@4": 0.0},
    ]
    out = test_time_compute(rows, [1, 4], {"generate": 0.5, "simulate": 0.25})
    # best_of@1 of the first episode = 1/4; @4 every sample is drawn, so 1; the second never succeeds.
    assert out["test_time"]["best_of@1"] == 0.125 and out["test_time"]["best_of@4"] == 0.5
    assert out["test_time"]["per_task"]["place"]["best_of@4"] == 1.0
    assert out["test_time"]["vote@1"] == 0.5 and out["test_time"]["vote@4"] == 0.0
    assert out["seconds_per_episode"] == {"best_of@1": 0.75, "best_of@4": 3.0, "vote@1": 0.75, "vote@4": 2.25}


def test_action_spread_tells_a_constant_from_a_clip_reading_policy(episodes, tmp_path):
    from embodied.eval.env_stats import action_spread

    cfg = EnvConfig(root=str(tmp_path / "env"), tasks=["push"], n_train=0, n_test=6)
    generate_episodes(cfg, progress=False)
    lines = (tmp_path / "env" / "test.jsonl").read_text().splitlines()
    recs = {r["id"]: r for r in map(json.loads, lines)}
    const = [{"id": i, "task": "push", "response": "<answer>0.40</answer>"} for i in recs]
    s = action_spread(const, recs)
    assert s["distinct"] == 1 and s["entropy_bits"] == 0.0 and s["std"] == 0.0
    assert s["corr_decisive"] != s["corr_decisive"]  # NaN: a constant has no correlation
    reading = [
        {"id": i, "task": "push", "response": f"<answer>{push.decisive(r):.4f}</answer>"}
        for i, r in recs.items()
    ]
    s = action_spread(reading, recs)
    assert s["distinct"] == 6 and s["corr_decisive"] > 0.99 and abs(s["entropy_bits"] - np.log2(6)) < 1e-9


def test_best_constant_matches_the_static_rule(episodes):
    """For place, MuJoCo's verdict per option is the centre-of-mass rule (static margins > 0)."""
    import numpy as np

    from embodied.eval.env_baselines import best_constant

    recs = [e.record for e in episodes]
    out = best_constant(recs)
    assert set(out) == {"place", "carry", "push"}
    place = [r for r in recs if r["task"] == "place"]
    by_rule = max(np.mean([r["meta"]["static_margins"][o] > 0 for r in place]) for o in range(5))
    assert out["place"]["success"] == by_rule and out["place"]["n"] == len(place)
    for v in out.values():
        assert v["ci95"][0] <= v["success"] <= v["ci95"][1]
    assert best_constant(recs, workers=2) == out  # episodes split over two processes: the same answer


def test_evaluate_env_best_of_n_and_vote(tiny_policy, episodes):
    model, processor = tiny_policy
    how = EnvEval(max_new_tokens=8, samples=4, k=[1, 4])
    result = evaluate_env(model, processor, episodes, VideoConfig(), how)
    assert set(result["test_time"]) == {"best_of@1", "best_of@4", "vote@1", "vote@4", "per_task"}
    assert all(len(p["sampled"]) == 4 for p in result["predictions"])
    # The untrained tiny model never writes a parseable action: nothing succeeds, nothing is hidden.
    assert result["test_time"]["best_of@4"] == 0.0 and result["test_time"]["vote@4"] == 0.0
    assert result["seconds_per_episode"]["best_of@4"] > result["seconds_per_episode"]["best_of@1"] > 0


def test_evaluate_env_samples_only_the_first_episodes_of_each_task(tiny_policy, episodes):
    """`sample_episodes`: greedy on every episode, test-time samples on the first ones of each task."""
    import dataclasses

    model, processor = tiny_policy
    second = [dataclasses.replace(e, record=e.record | {"id": e.record["id"] + "-b"}) for e in episodes]
    examples = list(episodes) + second  # carry, place, push, then each task's second episode
    how = EnvEval(max_new_tokens=8, batch_size=2, k=[2])
    greedy = evaluate_env(model, processor, examples, VideoConfig(), how)
    sampled = dataclasses.replace(how, samples=2, sample_episodes=1)
    result = evaluate_env(model, processor, examples, VideoConfig(), sampled)
    assert result["n"] == 6 and all(v["n"] == 2 for v in result["per_task"].values())
    assert [p["id"] for p in result["predictions"]] == [e.record["id"] for e in examples]
    assert [p["response"] for p in result["predictions"]] == [p["response"] for p in greedy["predictions"]]
    assert ["sampled" in p for p in result["predictions"]] == [True] * 3 + [False] * 3
    assert result["settings"]["sampled_episodes"] == 3 and set(result["test_time"]["per_task"]) == {
        "carry", "place", "push"
    }  # fmt: skip
    with pytest.raises(ValueError, match="test_time_episodes=-1"):
        evaluate_env(
            model, processor, examples, VideoConfig(), dataclasses.replace(sampled, sample_episodes=-1)
        )


def test_embodied_eval_on_episodes_runs_the_simulator(tmp_path):
    """`embodied eval` on an episode dataset: success, spread, best-of-N and vote, and a clear refusal of
    a shortcut baseline (episodes have no letter to guess)."""
    from embodied.config import load_config
    from embodied.run import eval as eval_cmd

    env = EnvConfig(root=str(tmp_path / "env"), n_train=0, n_test=1)
    generate_episodes(env, progress=False)
    over = [f"data.root={env.root}", f"run_dir={tmp_path}/run", "policy.path=tiny", "eval.samples=2"]
    result = eval_cmd(load_config(None, over + ["eval.k=[1,2]", "eval.max_new_tokens=8"]), progress=False)
    assert result["n"] == 3 and set(result["test_time"]) >= {"best_of@2", "vote@2", "per_task"}
    assert "best-of-2" in (tmp_path / "run" / "eval_test.md").read_text()
    with pytest.raises(ValueError, match="interactive episodes"):
        eval_cmd(load_config(None, over + ["eval.baseline=blind"]), progress=False)


def test_mixed_arm_pairs_as_many_mcqs_as_episodes_and_keeps_every_task():
    from embodied.experiments.env_feedback import _train_set

    def ex(**record):
        return Example(record, None)

    mcq = [ex(id=f"q{i}", family="arrow_of_time") for i in range(10)]
    env = [ex(id=f"{t}{i}", task=t) for t in ("carry", "place", "push") for i in range(20)]  # task by task
    data = {"mcq_train": mcq, "env_train": env}
    mixed = _train_set("mixed", data, seed=0)
    episodes = [e.record["task"] for e in mixed if "task" in e.record]
    assert len(mixed) == 20 and len(episodes) == 10  # half questions, half episodes
    assert set(episodes) == {"carry", "place", "push"}  # not the first 10 episodes (all carry)
    assert [e.record["id"] for e in _train_set("mixed", data, seed=0)] == [e.record["id"] for e in mixed]
    few = {"mcq_train": mcq, "env_train": env[:6]}  # fewer episodes than MCQs: every episode, in order
    assert [e.record["id"] for e in _train_set("mixed", few, seed=1)][6:] == [e.record["id"] for e in env[:6]]
