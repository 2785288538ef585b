"""Expert iteration (`embodied/train/expert.py`): which answer a round keeps, and a whole round on real
MuJoCo episodes with the tiny policy."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from embodied.config import ExpertConfig, SFTConfig
from embodied.data.load import Example
from embodied.envs.config import Turns
from embodied.rl.rollout import Rollout
from embodied.train.expert import answers_scored, round_prompts, train_expert
from embodied.train.expert_targets import balanced, select, task_successes
from embodied.train.state import Run


def _rollout(rewards: list[list[float]], success: list[list[float]], truncated: list[list[bool]]) -> Rollout:
    P, G = len(rewards), len(rewards[0])
    terms = [
        {"reward/total": rewards[p][g], "reward/success": success[p][g]} for p in range(P) for g in range(G)
    ]
    examples = [Example({"id": f"e{p}"}, None) for p in range(P)]
    flat = torch.zeros(P * G, 1, dtype=torch.long)
    return Rollout(
        examples,
        {},
        flat,
        flat,
        torch.ones(P * G),
        [f"p{p}g{g}" for p in range(P) for g in range(G)],
        terms,
        torch.tensor(rewards),
        torch.tensor([t for row in truncated for t in row]),
    )


def test_select_keeps_the_best_verified_untruncated_answer():
    ro = _rollout(
        rewards=[[0.2, 1.1, 0.9, 1.1], [0.5, 0.5, 0.5, 0.5], [0.1, 0.9, 0.4, 0.3], [1.2, 1.0, 0.0, 0.0]],
        success=[[0, 1, 1, 1], [0, 0, 0, 0], [0, 0, 1, 0], [1, 1, 0, 0]],
        truncated=[[False] * 4, [False] * 4, [False] * 4, [True, False, False, False]],
    )
    # prompt 0: rows 1 and 3 tie at 1.1, the first wins; prompt 1: nothing succeeded; prompt 2: the only
    # success (row 10) although row 9 scored more; prompt 3: the best (row 12) was truncated
    assert select(ro, "success") == [1, None, 10, 13]
    # best: the highest reward whenever the group has spread, success or not
    assert select(ro, "best") == [1, None, 9, 13]
    with pytest.raises(ValueError, match="expert.keep"):
        select(ro, "all")


def test_task_successes_name_each_row_by_its_prompt_task():
    ro = _rollout(rewards=[[1.0, 0.0], [0.0, 1.0]], success=[[1, 0], [0, 1]], truncated=[[False] * 2] * 2)
    ro.examples = [Example({"id": "a", "task": "push"}, None), Example({"id": "b", "family": "arrow"}, None)]
    assert task_successes(ro) == [("push", 1.0), ("push", 0.0), ("arrow", 0.0), ("arrow", 1.0)]
    # multi-turn: turn 2's rows (after the 4 first-turn rows) belong to trajectories 1 and 2 (`owner`)
    ro.terms = ro.terms + [{"reward/success": 1.0}, {"reward/success": 0.0}, {"reward/total": 0.0}]
    ro.owner = torch.tensor([0, 1, 2, 3, 1, 2, 3])
    assert task_successes(ro)[4:] == [("push", 1.0), ("arrow", 0.0)]  # a row without success is left out


def test_balanced_fine_tuning_follows_each_task_s_failures():
    pool = [Example({"id": f"p{i}", "task": "place"}, None) for i in range(30)]
    pool += [Example({"id": f"u{i}", "task": "push"}, None) for i in range(5)]
    success = {"place": [1.0] * 8, "push": [0.0] * 6 + [1.0] * 2}  # push fails 3 times in 4: weight 0.85
    out = balanced(pool, success, 95, seed=3)
    names = [e.record["task"] for e in out]
    assert len(out) == 95 and names.count("push") == 85 and names.count("place") == 10  # 0.85 : 0.1
    pushes = [e.record["id"] for e in out if e.record["task"] == "push"]
    assert sorted(pushes[:5]) == [f"u{i}" for i in range(5)]  # a whole pass before any repeats
    assert [e.record["id"] for e in balanced(pool, success, 95, seed=3)] == [e.record["id"] for e in out]
    assert balanced(pool[:30], success, 7, seed=0) == pool[:30]  # one task: as it is
    with pytest.raises(ValueError, match="expert.balance"):
        train_expert(ExpertConfig(balance="tasks"), SFTConfig(), Run(None, None, [None], "unused"))


def test_round_prompts_are_seeded_and_cover_the_set():
    a, b = round_prompts(50, 20, 0, 1), round_prompts(50, 20, 0, 1)
    assert a == b and len(set(a)) == 20 and round_prompts(50, 20, 0, 2) != a
    assert sorted(round_prompts(7, 0, 3, 1)) == list(range(7)) == sorted(round_prompts(7, 99, 3, 1))
    assert answers_scored(ExpertConfig(rounds=4, prompts_per_round=200, samples=16), 600) == 12_800
    assert answers_scored(ExpertConfig(rounds=2, prompts_per_round=0, samples=3), 7) == 42
    for bad in (ExpertConfig(rounds=0), ExpertConfig(samples=0), ExpertConfig(keep="all")):
        with pytest.raises(ValueError, match="expert"):
            train_expert(bad, SFTConfig(), Run(None, None, [None], "unused"))


@pytest.mark.slow  # 25 s; learning itself is the default suite's tests/test_rl_learns.py (GRPO)
def test_expert_iteration_from_format_only_learns_a_visible_answer(tmp_path):
    """As tests/test_rl_learns.py for GRPO: from the format-only start, rounds of keeping the verified answer
    and fine-tuning on it must lift the tiny base from chance to >= 0.9 on "which colour fills the video?"."""
    from embodied.eval.loop import MCQEval, evaluate
    from embodied.rl.rewards import mcq_rewards
    from tests.test_rl_learns import format_only_start

    model, processor, train, test, video, fmt, before = format_only_start(tmp_path)
    cfg = ExpertConfig(rounds=2, prompts_per_round=128, samples=4, sft_steps=30, batch_size=32, lr=1e-3)
    run = Run(model, processor, train, tmp_path / "ei", video, progress=False, reward_fn=mcq_rewards())
    info = train_expert(cfg, fmt, run)
    after = evaluate(model, processor, test, video, MCQEval(choice=False, progress=False))
    assert abs(before["accuracy"] - 0.5) < 0.15, f"format-only start is not at chance: {before['accuracy']}"
    assert info["answers_scored"] == 2 * 128 * 4 and info["kept"] > 128  # most prompts have a right answer
    assert after["accuracy"] >= 0.9, (
        f"expert iteration did not learn a visible answer: {after['accuracy']:.3f}"
    )


@pytest.mark.slow  # 15 s; expert rounds on episodes: the resume test below; grpo on episodes: test_cli_turns
def test_cli_expert_and_grpo_train_on_episodes_scored_by_the_simulator(tmp_path):
    """`embodied expert` and `embodied grpo` on an episode dataset: both score answers with MuJoCo
    (`rl.rewards.rewards_for`), so the same command trains on questions or on interactive episodes; an
    expert run resumed with more rounds matches the uninterrupted run."""
    from embodied.cli import main
    from embodied.data.episodes import generate_episodes
    from embodied.envs.config import EnvConfig
    from embodied.train.metrics import read_metrics

    env = EnvConfig(root=str(tmp_path / "env"), n_train=2, n_test=0)
    generate_episodes(env, progress=False)
    common = [f"data.root={env.root}", "policy.path=tiny", "grpo.max_new_tokens=8"]
    expert = ["expert.rounds=1", "expert.prompts_per_round=3", "expert.samples=2", "expert.sft_steps=1"]
    assert main(["expert", "-q", *common, *expert, f"run_dir={tmp_path}/ei"]) == 0
    [row] = read_metrics(tmp_path / "ei" / "metrics.jsonl")
    assert row["stage"] == "expert" and row["expert/answers_scored"] == 6 and "reward/success" in row
    assert (tmp_path / "ei" / "model" / "config.json").exists()
    grpo = ["grpo.steps=1", "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.checkpoint_every=0"]
    assert main(["grpo", "-q", *common, *grpo, "grpo.log_every=1", f"run_dir={tmp_path}/grpo"]) == 0
    [row] = [r for r in read_metrics(tmp_path / "grpo" / "metrics.jsonl") if r["stage"] == "grpo"]
    assert "reward/success" in row and "reward/unparseable" in row  # physics terms, not the MCQ rule

    # resumed with more rounds: round 2 is appended (the next test checks it matches an uninterrupted run)
    two = [*common, *expert[1:], "expert.rounds=2"]
    assert main(["expert", "-q", *two, "resume=auto", f"run_dir={tmp_path}/ei"]) == 0
    rows = read_metrics(tmp_path / "ei" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["expert/answers_scored"] == 12
    assert sorted(p.name for p in (tmp_path / "ei" / "checkpoints" / "expert").iterdir()) == [
        "step-00000001",
        "step-00000002",
    ]
    # a checkpoint written before the retry settings existed resumes as if they had their defaults
    state_file = tmp_path / "ei" / "checkpoints" / "expert" / "step-00000002" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["expert"]["retry_targets"] == "own"
    state["expert"] = {k: v for k, v in state["expert"].items() if not k.startswith("retry_")}
    state_file.write_text(json.dumps(state))
    assert main(["expert", "-q", *two, "resume=auto", f"run_dir={tmp_path}/ei"]) == 0
    assert [r["step"] for r in read_metrics(tmp_path / "ei" / "metrics.jsonl")] == [1, 2]
    # other expert settings than the rounds: a clear error, nothing overwritten
    assert main(["expert", "-q", *two, "expert.samples=3", "resume=auto", f"run_dir={tmp_path}/ei"]) == 1
    assert len(read_metrics(tmp_path / "ei" / "metrics.jsonl")) == 2
    # a fresh run in the same folder sets the earlier run's checkpoints aside instead of mixing with them
    assert main(["expert", "-q", *common, *expert, f"run_dir={tmp_path}/ei"]) == 0
    assert (tmp_path / "ei" / "checkpoints" / "expert.previous" / "step-00000002").is_dir()
    assert [p.name for p in (tmp_path / "ei" / "checkpoints" / "expert").iterdir()] == ["step-00000001"]
    assert [r["step"] for r in read_metrics(tmp_path / "ei" / "metrics.jsonl")] == [1]  # its own rows only


@pytest.mark.parametrize(
    "replay,balance",  # each 15 s: the replay variants run with -m slow, the plain resume by default
    [
        (False, "none"),
        pytest.param(True, "none", marks=pytest.mark.slow),
        pytest.param(True, "failures", marks=pytest.mark.slow),
    ],
)
def test_expert_resumed_with_more_rounds_reproduces_the_uninterrupted_run(tmp_path, replay, balance):
    """One round, then resumed to two, gives the same weights and metrics as two rounds at once: a round
    depends only on the policy it starts from, on (seed, round) and, with `replay`, on the earlier rounds'
    kept answers, which the checkpoint carries. With `balance=failures` the pool holds two groups (half the
    questions relabelled to a second family), so each round's draw per group is exercised across the
    resume too."""
    import copy

    from embodied.rl.rewards import mcq_rewards
    from embodied.train.metrics import read_metrics
    from tests.test_rl_learns import format_only_start

    model, processor, train, _, video, fmt, _ = format_only_start(tmp_path)
    if balance != "none":
        train = [
            dataclasses.replace(ex, record=ex.record | {"family": "second"}) if i % 2 else ex
            for i, ex in enumerate(train)
        ]
    start = copy.deepcopy(model)
    cfg = ExpertConfig(
        rounds=2, prompts_per_round=16, samples=4, sft_steps=5, batch_size=8, lr=1e-3, replay=replay,
        balance=balance,
    )  # fmt: skip
    how = {"seed": 3, "progress": False, "reward_fn": mcq_rewards()}
    run = lambda m, c, d, resume="": train_expert(  # noqa: E731
        c, fmt, Run(m, processor, train, tmp_path / d, video, resume=resume, **how)
    )
    run(model, cfg, "whole")
    run(copy.deepcopy(start), dataclasses.replace(cfg, rounds=1), "resumed")
    resumed = copy.deepcopy(start)  # the checkpoint, not this, supplies the weights
    info = run(resumed, cfg, "resumed", "auto")
    assert info["answers_scored"] == 2 * 16 * 4
    rows = [read_metrics(tmp_path / d / "metrics.jsonl") for d in ("whole", "resumed")]
    untimed = [[{k: v for k, v in r.items() if not k.startswith("time/")} for r in rs] for rs in rows]
    assert untimed[0] == untimed[1] and len(untimed[0]) == 2 and rows[0][1]["expert/kept"] > 0
    if balance != "none":  # both groups were sampled, and both got fine-tuning examples
        assert {"expert/success_second", "expert/tuned_second"} <= rows[0][1].keys()
        assert len([k for k in rows[0][1] if k.startswith("expert/tuned_")]) == 2
    if replay:  # the tuned set holds every prompt kept so far: round 2's plus round 1's others
        first, second = (round(r["expert/kept"] * 16) for r in rows[0])
        replayed = [r["expert/replayed"] for r in rows[0]]
        assert replayed[0] == first and max(first, second) <= replayed[1] <= first + second
        assert replayed[1] > second  # the two rounds' prompts differ, so some earlier answers stay
        with pytest.raises(ValueError, match="expert.replay"):
            train_expert(
                cfg, fmt, Run(model, processor, train, tmp_path / "mt", video, turns=Turns(2), **how)
            )
        three = dataclasses.replace(cfg, rounds=3)  # resumed on one prompt: the replayed others are missing
        with pytest.raises(ValueError, match="not in this training set"):
            ahead = Run(copy.deepcopy(start), processor, train[:1], tmp_path / "resumed", video, **how)
            train_expert(three, fmt, dataclasses.replace(ahead, resume="auto"))
    else:
        assert "expert/replayed" not in rows[0][0]
    moved = sum(
        not torch.equal(a, b) for a, b in zip(model.state_dict().values(), start.state_dict().values())
    )
    assert moved > 0  # the rounds fine-tuned something
    for name, w in model.state_dict().items():
        assert torch.equal(w, resumed.state_dict()[name]), name


def test_training_curves_share_the_axis_of_answers_sampled():
    from embodied.experiments.env_report import training_curve

    grpo = [{"stage": "grpo", "step": s, "reward/success": s / 10} for s in (5, 10)] + [
        {"stage": "sft", "step": 1}
    ]
    expert = [
        {"stage": "expert", "step": r, "expert/answers_scored": 3200 * r, "reward/success": r / 4}
        for r in (1, 2)
    ]
    assert training_curve(grpo, "reward/success", 128) == {640: 0.5, 1280: 1.0}
    assert training_curve(expert, "reward/success", 128) == {3200: 0.25, 6400: 0.5}
    assert training_curve(grpo, "reward/accuracy", 128) == {}
