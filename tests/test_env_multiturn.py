"""Multi-turn episodes (`env.turns`): the outcome clip, prompts with two videos, a 2-turn GRPO step and
evaluation, on CPU with the tiny model and 56 px push clips."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.server
import io
import json

import numpy as np
import pytest
import torch

from embodied.data.load import Example
from embodied.envs import push
from embodied.envs.config import Turns
from embodied.envs.reward import unparseable_penalty
from embodied.policy.architectures import architecture_of
from embodied.policy.model import (
    concat_batches,
    encode_conversations,
    encode_prompts,
    load_policy,
    repeat_batch,
    select_rows,
)
from embodied.rl.episodes import (
    AGAIN,
    again,
    outcome_clip,
    play,
    sample_episodes,
    trajectory_reward,
)
from embodied.rl.rewards import routed_rewards
from embodied.rl.rollout import Sampling, sample_groups
from embodied.train.state import Run
from embodied.video import Clip, VideoConfig

SHORT = "<think></think><answer>0.05</answer>"  # an impulse far too small: the puck stops short
SIZE = 56


@pytest.fixture(scope="module")
def push_examples():
    out = []
    for seed in (3, 4):
        record, frames = push.make_episode(seed, "easy", SIZE, SIZE, 4, 2.0)
        out.append(Example(record | {"id": f"push-{seed}", "video": f"{seed}.mp4"}, Clip(frames, 2.0)))
    return out


@pytest.fixture(scope="module")
def answering_policy(tiny_path, push_examples):
    """The tiny model after a few SFT steps towards SHORT: it answers in the format, so turn 1 executes,
    fails and a second turn follows."""
    from embodied.config import SFTConfig
    from embodied.train.sft import train_sft

    model, processor = load_policy(tiny_path)
    cfg = SFTConfig(steps=30, batch_size=2, lr=3e-3, eval_every=0, checkpoint_every=0, warmup_steps=0)
    run = Run(model, processor, push_examples, tiny_path.parent / "sft", progress=False)
    train_sft(cfg, run, target_fn=lambda record: SHORT)
    model.eval()
    return model, processor


def test_outcome_clip_is_the_executed_answer_at_video_fps(push_examples):
    ex = push_examples[0]
    clip = outcome_clip(ex.record, SHORT, VideoConfig(fps=2.0), ex.clip)
    assert clip.fps == 2.0 and clip.frames.shape == (4, SIZE, SIZE, 3)  # 0 to 1.5 s of sliding, every 0.5 s
    assert np.abs(clip.frames[0].astype(int) - clip.frames[-1].astype(int)).sum() > 0  # the puck moved
    with pytest.raises(ValueError, match="unparseable"):
        outcome_clip(ex.record, "no answer", VideoConfig(), ex.clip)


def test_frozen_turn_clip_holds_the_reset_for_as_many_frames(tiny_policy, push_examples):
    """`env.turn_clip=frozen`, the control for a second look: the outcome clip's first frame held, the same
    size and length, nothing of what the answer did; `play` shows it at turn 2."""
    ex, video = push_examples[0], VideoConfig(fps=2.0)
    moving = outcome_clip(ex.record, SHORT, video, ex.clip)
    frozen = outcome_clip(ex.record, SHORT, video, ex.clip, "frozen")
    assert frozen.frames.shape == moving.frames.shape and frozen.fps == moving.fps
    assert all(np.array_equal(f, moving.frames[0]) for f in frozen.frames)
    model, processor = tiny_policy
    first = ([SHORT], routed_rewards()([SHORT], [ex.record]))
    args = (model, processor, [ex], video, routed_rewards())
    ep = play(*args, Turns(2, clip="frozen"), Sampling(max_new_tokens=4), first=first)
    assert np.array_equal(ep.clips[0][1].frames, frozen.frames)
    ep = play(*args, Turns(2), Sampling(max_new_tokens=4), first=first)
    assert np.array_equal(ep.clips[0][1].frames, moving.frames)
    with pytest.raises(ValueError, match="env.turn_clip"):
        outcome_clip(ex.record, SHORT, video, ex.clip, "blank")


def test_later_turn_settings_are_refused_with_one_turn():
    """A setting of the turns after the first is an error with env.turns=1, where it would be ignored."""
    from embodied.envs.config import EnvConfig

    Turns.of(EnvConfig(turns=2, turn_clip="frozen", retry_temperature=2.0, retry_min_p=0.01))
    Turns.of(EnvConfig())
    for bad in ({"turn_clip": "frozen"}, {"retry_temperature": 2.0}, {"turn_words": True}):
        with pytest.raises(ValueError, match=f"env.{next(iter(bad))}=.*env.turns=1"):
            Turns.of(EnvConfig(**bad))
    with pytest.raises(ValueError, match="env.turn_clip"):
        Turns.of(EnvConfig(turns=2, turn_clip="blank"))


def test_turn_two_rows_carry_both_clips_pixels(tiny_policy, push_examples):
    """verl users lose images after turn 1: here a turn-2 row, next to turn-1 rows in one batch, keeps the
    episode's clip and the outcome clip, each with its own pixels, through concat_batches and select_rows."""
    _, processor = tiny_policy
    video = VideoConfig()
    recs, clips = [e.record for e in push_examples], [e.clip for e in push_examples]
    outcome = outcome_clip(recs[1], SHORT, video, clips[1])
    first = repeat_batch(encode_prompts(processor, recs, clips, video), 2)
    second = encode_conversations(processor, [recs[1]], [[clips[1], outcome]], [[(SHORT, AGAIN)]], video)
    assert second["video_grid_thw"].shape[0] == 2
    batch = concat_batches([first, second], processor.tokenizer.pad_token_id)
    row = select_rows(batch, [4])  # the turn-2 row, after 2 prompts x 2 members
    media = architecture_of(processor).video_inputs([clips[1], outcome], video)
    alone = processor.video_processor(videos=media["videos"], **media["videos_kwargs"], return_tensors="pt")
    assert torch.equal(row["video_grid_thw"], alone["video_grid_thw"])
    assert torch.equal(row["pixel_values_videos"], alone["pixel_values_videos"])
    assert row["video_grid_thw"][1, 0] == 2  # 4 outcome frames, 2 per temporal patch
    turn1 = select_rows(batch, [2])  # member 0 of prompt 1: its one clip
    assert turn1["video_grid_thw"].shape[0] == 1
    assert torch.equal(turn1["pixel_values_videos"], select_rows(first.unique, [1])["pixel_values_videos"])


def test_a_malformed_answer_ends_the_episode_with_the_penalty(tiny_policy, push_examples):
    model, processor = tiny_policy  # untrained: its turn-2 answer does not parse
    ex = push_examples[:1]
    first = ([SHORT], routed_rewards()([SHORT], [ex[0].record]))
    six = Sampling(max_new_tokens=6)
    ep = play(model, processor, ex, VideoConfig(), routed_rewards(), Turns(3, "last"), six, first=first)
    (traj,) = ep.per_trajectory()
    assert len(traj) == 2 and traj[0][1]["reward/short"] == -1 and traj[1][1]["reward/unparseable"] == 1
    assert float(ep.rewards) == -unparseable_penalty() and len(ep.clips[0]) == 2
    first = (["gibberish"], routed_rewards()(["gibberish"], [ex[0].record]))
    ep = play(model, processor, ex, VideoConfig(), routed_rewards(), Turns(3, "mean"), six, first=first)
    assert len(ep.per_trajectory()[0]) == 1 and float(ep.rewards) == -unparseable_penalty()


def test_turn_words_say_the_outcome():
    assert again({"reward/short": -1.0, "reward/total": -0.2, "reward/success": 0.0}, False) == AGAIN
    assert again({"reward/short": -1.0, "reward/total": -0.2}, True) == f"The outcome: short. {AGAIN}"


def test_trajectory_rewards_and_checks():
    """A `Turns` checks itself when made (`check_turns`, the one check of the env.turns settings), so
    `Turns.of(cfg.env)` refuses what every command, trainer and evaluation would otherwise get."""
    from embodied.envs.config import EnvConfig

    assert trajectory_reward([0.1, 1.5], "last") == 1.5 and trajectory_reward([0.1, 1.5], "mean") == 0.8
    with pytest.raises(ValueError, match="env.turn_reward"):
        Turns(2, "sum")
    with pytest.raises(ValueError, match="env.turns"):
        Turns(0, "last")
    for bad, why in [({"turns": 2, "retry_min_p": 1.0}, "env.retry_min_p"), ({"turns": 1.5}, "env.turns")]:
        with pytest.raises(ValueError, match=why):
            Turns.of(EnvConfig(**bad))
    with pytest.raises(ValueError, match="env.turn_words=True: set"):
        dataclasses.replace(Turns(2, words=True), n=1)  # a later-turn setting with one turn: ignored
    assert Turns(2, retry_temperature=2.0, retry_min_p=0.1).evaluation() == Turns(2)  # eval: no retries


def test_retry_temperature_draws_later_turns_hotter(answering_policy, push_examples):
    """`env.retry_temperature`: turn 1 is drawn as without it, every later turn at the retry temperature (its
    rows carry it, so GRPO's log-probs are taken at it); a negative one is refused."""
    model, processor = answering_policy
    video, reward = VideoConfig(), routed_rewards()
    args, sampling = (model, processor, push_examples, video, reward), Sampling(4, 12, temperature=0.2)
    own = sample_episodes(*args, Turns(2), sampling, seeds=[1, 2])
    hot = sample_episodes(*args, Turns(2, retry_temperature=3.0), sampling, seeds=[1, 2])
    assert [hot.texts[i] for i in range(8)] == [own.texts[i] for i in range(8)]  # turn 1 unchanged
    assert (hot.turn == 2).any(), hot.texts
    assert torch.all(hot.temperature[hot.turn == 1] == 0.2)
    assert torch.all(hot.temperature[hot.turn == 2] == 3.0)
    assert torch.all(own.temperature == 0.2)
    greedy = play(*args, Turns(2, retry_temperature=3.0), Sampling(max_new_tokens=12))
    assert all(torch.all(t.temperature == 1.0) for t in greedy.turns)  # greedy play stays greedy
    with pytest.raises(ValueError, match="env.retry_temperature"):
        sample_episodes(*args, Turns(2, retry_temperature=-1.0), sampling)


def test_two_turn_grpo_end_to_end(answering_policy, push_examples, tmp_path, monkeypatch):
    """A 2-turn rollout (turn 1 fails, turn 2 is its own prompt with both clips), its update, and train_grpo
    with turns=2 logging per-turn success and each turn's answer."""
    from grpo_configs import grpo_step

    from embodied.config import GRPOConfig
    from embodied.train.grpo import train_grpo

    model, processor = answering_policy
    video, reward, sampling = VideoConfig(), routed_rewards(), Sampling(2, 12, temperature=0.2)
    ro = sample_episodes(model, processor, push_examples, video, reward, Turns(2), sampling, seeds=[1, 2])
    first = ro.turn == 1
    single = sample_groups(model, processor, push_examples, video, reward, sampling, seeds=[1, 2])
    assert [ro.texts[i] for i in range(4)] == single.texts  # turn 1 is drawn as a single-turn rollout is
    assert int(first.sum()) == 4 and ro.owner[first].tolist() == [0, 1, 2, 3]
    assert (ro.turn == 2).any(), ro.texts  # the format-trained policy answered, the puck stopped short
    two = (ro.turn == 2).nonzero().flatten().tolist()
    assert ro.batch["video_grid_thw"].shape[0] == 4 + 2 * len(two)
    assert all(len(ro.clips[t]) == 2 for t in ro.owner[two].tolist())
    assert ro.stats["turns/mean"] == pytest.approx(1 + len(two) / 4)
    assert ro.rewards.shape == (2, 2) and ro.ids.shape[0] == 4 + len(two)
    cfg = GRPOConfig(
        steps=2,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=12,
        log_every=1,
        lr=1e-4,
        kl_coef=0.0,
        temperature=0.2,
    )
    metrics = grpo_step(model, processor, cfg).learn(ro, 1)
    assert np.isfinite(metrics["loss/total"])

    from embodied.train import tracking

    monkeypatch.setattr(
        tracking,
        "_CURRENT",
        tracking.Tracking(tracking.LogConfig(["jsonl", "tensorboard"], samples_every=1, samples=2)),
    )
    run = Run(model, processor, push_examples, tmp_path, progress=False, reward_fn=reward, turns=Turns(2))
    train_grpo(cfg, run)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "turns/success@2" in r]
    assert len(logged) == 2 and all(r["turns/success@2"] >= r["turns/success@1"] for r in logged)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and "turn 1: " in samples[0]["answers"][0]
    assert any("turn2/reward/total" in r for s in samples for r in s["rewards"])
    assert list((tmp_path / "tensorboard" / "grpo").glob("events.*"))
    with pytest.raises(ValueError, match="env.turns=2"):
        train_grpo(cfg.__class__(dynamic_sampling=True), run)


def test_evaluate_env_reports_success_after_each_turn(answering_policy, push_examples):
    from embodied.eval.env_loop import EnvEval, evaluate_env

    model, processor = answering_policy
    how = EnvEval(max_new_tokens=12, samples=2, k=[1, 2], turns=Turns(2), seed=0)
    res = evaluate_env(model, processor, push_examples, VideoConfig(), how)
    t = res["turns"]["per_task"]["push"]
    assert t["n"] == 2 and set(t["greedy"]) == {"success@1", "success@2", "calls"}
    assert t["greedy"]["success@2"]["rate"] >= t["greedy"]["success@1"]["rate"] == res["success"]
    assert 1 <= t["greedy"]["calls"] <= 2 and set(t["best_of"]) == {"best_of@1", "best_of@2"}
    assert all(
        len(p["turns"]) in (1, 2) and p["turns"][0]["response"] == p["response"] for p in res["predictions"]
    )
    assert all(len(p["sampled_turns"]) == 2 for p in res["predictions"])
    # the paired differences are per episode, so their means are the differences of the means
    s, paired = res["turns"]["sampled"], res["turns"]["paired"]
    assert set(paired) == {"sampled_turn2_minus_turn1", "sampled_turn2_minus_best_of_2"}
    assert paired["sampled_turn2_minus_turn1"][0] == pytest.approx(
        s["success@2"]["rate"] - s["success@1"]["rate"]
    )
    best = res["turns"]["best_of"]["best_of@2"]["rate"]
    assert paired["sampled_turn2_minus_best_of_2"][0] == pytest.approx(s["success@2"]["rate"] - best)
    assert paired["sampled_turn2_minus_turn1"][0] >= 0  # a trajectory solved at turn 1 stays solved
    assert set(res["turns"]["corrections"]) == {"push"}  # push declares CORRECTIONS
    from embodied.experiments.env_report import turns_markdown

    env = {k: v for k, v in res.items() if k != "predictions"}
    page = "\n".join(turns_markdown([{"seed": 0, "stages": {"sim": {"env": env}}}]))
    assert "| sim | push | " in page and "greedy, after turn 2" in page and "best-of-2" in page
    assert "right-way retries" in page


def test_correction_summary_scores_the_direction_of_the_second_answer(push_examples):
    """After a short strike the right second answer is harder; after an overshoot, softer; a repeat
    moves nothing. Hand-built greedy trajectories with push's numeric answers."""
    from embodied.eval.env_stats import correction_summary

    rec = push_examples[0].record
    ans = lambda j: f"<think></think><answer>{j}</answer>"  # noqa: E731
    short, over = (
        {"reward/short": -1.0, "reward/success": 0.0},
        {"reward/overshoot": -1.0, "reward/success": 0.0},
    )
    rows = [
        {"id": rec["id"], "task": "push", "turns": [{"response": ans(a), "terms": t}, {"response": ans(b)}]}
        for a, t, b in [
            (0.1, short, 0.2),  # right
            (0.1, short, 0.1),  # repeated
            (0.1, short, 0.05),  # wrong
            (0.9, over, 0.5),  # right
            (0.9, over, "none"),  # turn 2 does not parse: not counted
        ]
    ] + [{"id": rec["id"], "task": "push", "turns": [{"response": ans(0.3), "terms": short}]}]  # one turn
    got = correction_summary(rows, {rec["id"]: rec})["push"]
    assert got["terms"]["short"]["n"] == 3 and got["terms"]["short"]["right"] == pytest.approx(1 / 3)
    assert got["terms"]["short"]["repeated"] == pytest.approx(1 / 3)
    assert got["terms"]["overshoot"] == {
        "n": 1,
        "right": 1.0,
        "ci95": got["terms"]["overshoot"]["ci95"],
        "repeated": 0.0,
    }
    assert got["balanced"] == pytest.approx((1 / 3 + 1) / 2)
    place = {"id": "p", "task": "place", "turns": []}
    assert "place" not in correction_summary([place], {})  # place declares no CORRECTIONS


def test_expert_iteration_over_two_turns_keeps_the_answer_that_worked_after_a_miss(
    answering_policy, push_examples, tmp_path
):
    """Multi-turn expert iteration (`train_expert(turns=2)`): a turn-2 answer that succeeded is kept with its
    conversation (the failed turn-1 answer, the words and the clip of its outcome), and fine-tuning on a
    batch of turn-1 and turn-2 examples encodes each with its own clips."""
    import copy

    from embodied.config import ExpertConfig, SFTConfig
    from embodied.train.expert import train_expert
    from embodied.train.expert_targets import prompt_id, select_turns
    from embodied.train.metrics import read_metrics
    from embodied.train.sft import train_sft

    model, processor = answering_policy
    model = copy.deepcopy(model)  # fine-tuned below; the fixture is shared
    video, reward = VideoConfig(), routed_rewards()
    sampling = Sampling(2, 12, temperature=0.2)
    ro = sample_episodes(model, processor, push_examples, video, reward, Turns(2), sampling, seeds=[1, 2])
    two = (ro.turn == 2).nonzero().flatten().tolist()
    assert two, ro.texts
    assert select_turns(ro) == []  # nothing succeeded: nothing kept
    # the simulator's verdict on one turn-2 answer and one turn-1 answer of the other prompt, set by hand
    i = two[0]
    t = int(ro.owner[i])
    j = [r for r in range(len(ro.texts)) if ro.turn[r] == 1 and int(ro.owner[r]) // 2 != t // 2][0]
    for r in (i, j):
        ro.terms[r] = ro.terms[r] | {"reward/success": 1.0, "reward/total": 1.2}
    kept = select_turns(ro)
    assert len(kept) == 2
    (late, text) = [k for k in kept if k[0].history][0]
    first = [r for r in range(len(ro.texts)) if ro.turn[r] == 1 and int(ro.owner[r]) == t][0]
    assert text == ro.texts[i] and late.history == ((ro.texts[first], AGAIN),)
    assert late.record["id"] == f"{ro.examples[t // 2].record['id']}/turn2"
    assert len(late.outcomes) == 1 and np.array_equal(late.outcomes[0].frames, ro.clips[t][1].frames)
    targets = {ex.record["id"]: txt for ex, txt in kept}
    cfg = SFTConfig(steps=2, batch_size=2, eval_every=0, checkpoint_every=0, log_every=1)
    before = [p.detach().clone() for p in model.parameters()]
    run = Run(model, processor, [k[0] for k in kept], tmp_path / "sft", video, progress=False)
    train_sft(cfg, run, target_fn=lambda rec: targets[rec["id"]])
    losses = [r["loss/sft"] for r in read_metrics(tmp_path / "sft" / "metrics.jsonl") if "loss/sft" in r]
    assert losses and all(np.isfinite(losses))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # the whole loop with two turns: runs, logs per-turn success and what it kept at each turn
    ex = ExpertConfig(rounds=1, prompts_per_round=2, samples=2, sft_steps=1, batch_size=2)
    run = Run(model, processor, push_examples, tmp_path / "ei", video, progress=False, reward_fn=reward)
    info = train_expert(ex, cfg, dataclasses.replace(run, turns=Turns(2)), 12)
    [row] = read_metrics(tmp_path / "ei" / "metrics.jsonl")
    assert info["answers_scored"] == row["expert/answers_scored"] >= 4
    assert "turns/success@2" in row and "expert/kept_turn2" in row
    # kept: the share of prompts with any kept answer; kept_examples: every turn's examples per prompt
    assert row["expert/kept_examples"] == pytest.approx(row["expert/kept_turn1"] + row["expert/kept_turn2"])
    assert row["expert/kept"] <= min(1.0, row["expert/kept_examples"])
    assert prompt_id("push-0003/turn2/4") == prompt_id("push-0003/turn2") == "push-0003"
    with pytest.raises(ValueError, match="env.turns > 1"):
        train_expert(ExpertConfig(retry_targets="group"), cfg, Run(model, processor, push_examples, tmp_path))
    with pytest.raises(ValueError, match="keep=success"):
        train_expert(
            ExpertConfig(keep="best"), cfg, Run(model, processor, push_examples, tmp_path, turns=Turns(2))
        )


def _hand_rollout(examples, rows, clips):
    """A multi-turn `Rollout` of 2 prompts x 3 trajectories from `(trajectory, turn, text, terms)` rows, for
    `select_turns`: no token tensors, every row untruncated."""
    from embodied.rl.rollout import Rollout

    return Rollout(
        examples=list(examples),
        batch=None,
        ids=None,
        mask=None,
        temperature=torch.ones(len(rows)),
        texts=[r[2] for r in rows],
        terms=[dict(r[3]) for r in rows],
        rewards=torch.zeros(2, 3),
        truncated=torch.zeros(len(rows), dtype=torch.bool),
        owner=torch.tensor([r[0] for r in rows]),
        turn=torch.tensor([r[1] for r in rows]),
        clips=clips,
    )


def test_better_retry_targets_teach_the_nearest_answer_that_did_better(push_examples):
    """`expert.retry_targets=better`: after a failed run, the target is the group's answer nearest to the last
    failed one among those the simulator scored higher (success or not), once per distinct run."""
    from embodied.train.expert_targets import select_turns

    a = lambda j: f"<think></think><answer>{j}</answer>"  # noqa: E731
    short = lambda total: {"reward/success": 0.0, "reward/total": total, "reward/short": -1.0}  # noqa: E731
    over = lambda total: {"reward/success": 0.0, "reward/total": total, "reward/overshoot": -1.0}  # noqa: E731
    ok = {"reward/success": 1.0, "reward/total": 1.2}
    # (trajectory, turn, text, terms); prompt 0 is trajectories 0-2, prompt 1 is 3-5 (G = 3)
    rows = [
        (0, 1, a(0.1), short(-0.2)), (1, 1, a(0.1), short(-0.2)), (2, 1, a(0.5), ok),
        (3, 1, a(0.9), over(-0.2)), (4, 1, a(0.9), over(-0.2)), (5, 1, a(0.95), over(-0.3)),
        (0, 2, a(0.3), short(0.1)), (1, 2, a(0.8), over(0.0)), (3, 2, a(0.95), over(-0.3)),
        (4, 2, a(0.9), over(-0.2)),
    ]  # fmt: skip
    ro = _hand_rollout(push_examples, rows, [[push_examples[t // 3].clip] * 2 for t in range(6)])
    got = [(ex.record["id"], ex.history, text) for ex, text in select_turns(ro, targets="better")]
    # prompt 0: after 0.1 fell short, 0.3 (short, but scored better) is nearer than 0.8 and the success 0.5;
    # trajectory 1 failed with the same 0.1: not taught twice. Prompt 1: nothing scored above 0.9's -0.2.
    assert got == [("push-3", (), a(0.5)), ("push-3/turn2/1", ((a(0.1), AGAIN),), a(0.3))]
    group = [text for _, text in select_turns(ro, targets="group")]
    assert group == [a(0.5), a(0.5)]  # group targets teach the success whatever the failure


def test_group_retry_targets_teach_a_retry_from_a_siblings_success(push_examples):
    """`expert.retry_targets=group`: after a run of failed answers that a trajectory did not recover from, the
    group's best success (any turn) is the target, once per distinct run; `own` keeps per-turn successes."""
    from embodied.train.expert_targets import select_turns

    ok = {"reward/success": 1.0, "reward/total": 1.2}
    miss = {"reward/success": 0.0, "reward/total": -0.2, "reward/short": -1.0}
    # (trajectory, turn, text, terms); prompt 0 is trajectories 0-2, prompt 1 is 3-5 (G = 3)
    rows = [
        (0, 1, "A", miss), (1, 1, "A", miss), (2, 1, "D", miss), (3, 1, "C", ok), (4, 1, "A", miss),
        (5, 1, "C", ok), (0, 2, "C", ok), (1, 2, "B", miss), (2, 2, "B", miss), (4, 2, "A", miss),
    ]  # fmt: skip
    clip = push_examples[0].clip
    outcomes = {t: Clip(np.full_like(clip.frames, t), 2.0) for t in (0, 1, 2, 4)}
    clips = [[push_examples[t // 3].clip] + ([outcomes[t]] if t in outcomes else []) for t in range(6)]
    ro = _hand_rollout(push_examples, rows, clips)
    own = select_turns(ro)
    assert [(ex.record["id"], ex.history, text) for ex, text in own] == [
        ("push-3/turn2", (("A", AGAIN),), "C"),
        ("push-4", (), "C"),
    ]
    group = select_turns(ro, targets="group")
    assert group[: len(own)] == own
    extra = [
        (ex.record["id"], ex.history, text, int(ex.outcomes[0].frames[0, 0, 0, 0])) for ex, text in group[2:]
    ]
    # prompt 0: trajectory 1 failed with A as trajectory 0 did (already taught), trajectory 2 with D: taught C
    # prompt 1: trajectory 4 failed with A twice: taught C, the sibling's turn-1 success, after its first A
    assert extra == [("push-3/turn2/2", (("D", AGAIN),), "C", 2), ("push-4/turn2/1", (("A", AGAIN),), "C", 4)]
    with pytest.raises(ValueError, match="expert.retry_targets"):
        select_turns(ro, targets="all")


def _digest(frames) -> str:
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    return hashlib.sha256(frames.tobytes() + str(frames.shape).encode()).hexdigest()


def _conversations(ep, turns: Turns, seeds) -> dict:
    """Every turn of `ep` as the conversation a chat request of it must hold (the clips' pixels, the
    question and each later turn's words, the earlier answers, the temperature and the seed) -> its answer."""
    from embodied.questions import format_question
    from embodied.rl.rollout import sampling_seed

    table, G, trajs = {}, ep.group_size, ep.per_trajectory()
    for k, turn in enumerate(ep.turns, 1):
        for row, (t, text) in enumerate(zip(turn.trajectories, turn.texts)):
            rec, earlier = ep.examples[t // G].record, trajs[t][: k - 1]
            said = [format_question(rec["question"], rec["options"], rec.get("instruction"))]
            said += [again(terms, turns.words) for _, terms in earlier]
            seed = sampling_seed(seeds[t // G], t % G, *([k] if k > 1 else [])) % 2**31
            clips = tuple(_digest(c.frames) for c in ep.clips[t][:k])
            key = (clips, tuple(said), tuple(x for x, _ in earlier), float(turn.temperature[row]), seed)
            table[key] = text
    return table


class _Replay(http.server.BaseHTTPRequestHandler):
    """A chat server that answers a request with the answer the local model gave to the same conversation
    (`_conversations`: the pixels decoded from the request's PNGs, its texts, temperature and seed), and
    HTTP 404 to any other: a served request that differs from the local prompt in anything gets no answer."""

    table: dict = {}

    def do_POST(self):  # noqa: N802 - the stdlib's name
        from PIL import Image

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        clips, said, answers = [], [], []
        for m in body["messages"]:
            if m["role"] == "assistant":
                answers.append(m["content"])
                continue
            urls = [p["image_url"]["url"] for p in m["content"] if p["type"] == "image_url"]
            png = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))) for u in urls]
            clips.append(_digest(np.stack([np.asarray(x.convert("RGB")) for x in png])))
            said += [p["text"] for p in m["content"] if p["type"] == "text"]
        key = (tuple(clips), tuple(said), tuple(answers), body["temperature"], body.get("seed"))
        text = self.table.get(key)
        message = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
        status, data = (200, json.dumps(message).encode()) if text is not None else (404, b"{}")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def replay():
    import threading

    _Replay.table = {}
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_turn_reward_changes_a_served_result_as_it_changes_a_local_one(
    answering_policy, push_examples, replay, tmp_path
):
    """Issue 61: local generation and a served endpoint play through one loop (`play_turns`), which takes
    `Turns` whole, so `env.turn_reward` (and every other turn setting) acts on a served result exactly as on
    a local one: the same episodes with the same answers (a real HTTP server answers each request with what
    the local model answered to that conversation, and nothing else: the pixels of every clip, outcome clips
    included, the words, answers, temperatures and seeds must match) give the same trajectory rewards under
    `last` and under `mean`. A trajectory whose request failed is its `Failure`, unscored (NaN)."""
    from embodied.eval.endpoint import EndpointClient, Failure
    from embodied.eval.served import EndpointAnswerer

    model, processor = answering_policy
    video, reward, seeds, temps = VideoConfig(), routed_rewards(), [1, 2], torch.full((8,), 0.2)
    local, served = {}, {}
    for how in ("last", "mean"):
        turns = Turns(2, how, words=True, retry_temperature=3.0)  # later turns hot: they differ from turn 1
        local[how] = play(
            model, processor, push_examples, video, reward, turns, Sampling(4, 12), temps, seeds
        )
        _Replay.table |= _conversations(local[how], turns, seeds)
        answerer = EndpointAnswerer(EndpointClient(replay, "m", tmp_path / how, retries=0), video, 12)
        served[how] = answerer.play(push_examples, reward, turns, 4, temps, seeds)
        assert not served[how].failed and served[how].per_trajectory() == local[how].per_trajectory()
        assert torch.equal(served[how].rewards, local[how].rewards)
    trajs = local["last"].per_trajectory()
    assert trajs == local["mean"].per_trajectory()  # the setting changes the rewards, not the play
    assert any(len(x) == 2 for x in trajs), "a turn 1 failed and a turn 2 followed"
    for t, traj in enumerate(trajs):
        totals = [terms["reward/total"] for _, terms in traj]
        assert float(served["last"].rewards.flatten()[t]) == pytest.approx(totals[-1])
        assert float(served["mean"].rewards.flatten()[t]) == pytest.approx(np.mean(totals))
    moved = served["mean"].rewards - served["last"].rewards
    assert torch.equal(moved, local["mean"].rewards - local["last"].rewards) and moved.abs().sum() > 0

    _Replay.table = {k: v for k, v in _Replay.table.items() if len(k[0]) == 1}  # turn 2 now fails
    answerer = EndpointAnswerer(EndpointClient(replay, "m", tmp_path / "lost", retries=0), video, 12)
    lost = answerer.play(
        push_examples, reward, Turns(2, "mean", words=True, retry_temperature=3.0), 4, temps, seeds
    )
    two = {t for t, x in enumerate(trajs) if len(x) == 2}
    assert set(lost.failed) == two and all(isinstance(lost.per_trajectory()[t], Failure) for t in two)
    flat = lost.rewards.flatten()
    assert all(flat[t].isnan() == (t in two) for t in range(8))
    assert [x for t, x in enumerate(lost.per_trajectory()) if t not in two] == [
        x for t, x in enumerate(trajs) if t not in two
    ]
