"""`embodied bench prefix` at tiny size: both updates run side by side through the command's own dispatch,
the JSON holds every round of both with the predicted ratio, the token counts are the prompt's, the shared
variant really took the shared-prefix path (and the plain one did not), and its rewards give non-zero
advantages; the predicted ratio by hand; the timing reward of `bench step`."""

from __future__ import annotations

import json

import pytest

from embodied.bench import prefix
from embodied.bench.config import BenchRun
from embodied.config import load_config

OVERRIDES = [
    "policy.path=tiny-base",
    "bench.prefix_frames=4",
    "bench.prefix_size=112",
    "bench.prefix_group=4",
    "bench.prefix_tokens=12",
    "bench.rounds=2",
    "bench.warmup=1",
    "threads=1",
]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from embodied import run

    out = tmp_path_factory.mktemp("bench_prefix")
    cfg = load_config(None, [*OVERRIDES, f"run_dir={out}"], schema=BenchRun)
    result = run.named("embodied.bench", "prefix", cfg, progress=False)
    assert json.loads((out / "bench_prefix.json").read_text()) == result
    return cfg, result


def test_both_updates_are_timed_in_every_round_with_the_predicted_ratio(measured):
    cfg, r = measured
    assert r["benchmark"] == "prefix" and r["machine"]["cpu"] and r["versions"]["transformers"]
    assert [row["round"] for row in r["rounds"]] == [0, 1]
    for v in ("shared", "plain"):
        assert all(row[v]["s"] > 0 for row in r["rounds"])
        assert r["s_per_update"][v]["n"] == 2
    ratio = r["ratio"]
    med = r["s_per_update"]
    assert ratio["measured_median"] == round(med["shared"]["median"] / med["plain"]["median"], 4)
    t = r["tokens"]
    assert (t["G_group"], t["C_completion_tokens"]) == (4, 12)
    assert ratio["predicted"] == round(prefix.token_ratio(t["P_prompt_tokens"], 4, 12), 4)
    assert 0 < r["predicted"]["model_flop_ratio"] < 1
    assert isinstance(r["meets_target"], bool) and "timing" in r["reward"]
    for v in ("shared", "plain"):  # where the seconds go: parts of the update, not overlapping
        parts = r["parts_median_s"][v]
        assert min(parts["vision"], parts["text"], parts["backward"]) > 0
        assert sum(parts.values()) <= r["s_per_update"][v]["max"] + 1e-3


def test_the_shared_update_took_the_shared_path_and_the_plain_one_did_not(measured):
    _, r = measured
    for row in r["rounds"]:
        assert row["shared"]["shared_prefix_passes"] >= 1  # the policy's pass (and the reference's, with KL)
        assert row["plain"]["shared_prefix_passes"] == 0
        assert any(">shared_prefix>" in k for k in row["shared"]["parts_s"])
        assert not any("shared_prefix" in k for k in row["plain"]["parts_s"])
        assert row["shared"]["grad_norm"] > 0 and row["plain"]["grad_norm"] > 0


def test_the_counts_are_the_prompts_and_the_advantages_are_not_zero(measured):
    from embodied.policy.model import encode_prompts, load

    cfg, r = measured
    _, processor = load(cfg.policy)
    example = prefix.clip_example(cfg.bench.prefix_frames, cfg.bench.prefix_size, cfg.video.fps, cfg.seed)
    batch = encode_prompts(processor, [example.record], [example.clip], prefix.prefix_video(cfg))
    assert r["tokens"]["P_prompt_tokens"] == batch["input_ids"].shape[1]
    # tiny-base (Qwen2.5-VL): 112 px = 8 x 8 patches of 14 px, merged 2 x 2, 4 frames = 2 temporal patches
    assert r["tokens"]["visual_tokens"] == 2 * 4 * 4 == int((batch["mm_token_type_ids"] == 2).sum())
    adv = r["advantages"]
    assert len(adv) == 4 and all(a != 0 for a in adv) and abs(sum(adv)) < 1e-3


def test_the_predicted_ratio_by_hand():
    # P = 1,000, G = 8, C = 96: (1000 + 768) / (8 * 1096) = 1768 / 8768
    assert prefix.token_ratio(1000, 8, 96) == pytest.approx(1768 / 8768)
    assert prefix.token_ratio(10, 1, 5) == 1.0  # a group of one shares nothing


def test_random_completions_are_decodable_and_end_the_turn(tiny_policy):
    from embodied.policy.model import end_of_turn

    _, processor = tiny_policy
    ids = prefix.random_completions(processor, 3, 20, seed=0)
    tok = processor.tokenizer
    assert ids.shape == (3, 20)
    assert (ids[:, -1] == tok.convert_tokens_to_ids(end_of_turn(processor))).all()
    body = ids[:, :-1]
    assert int(body.max()) < tok.vocab_size and not set(body.flatten().tolist()) & set(tok.all_special_ids)
    assert all(tok.decode(row) for row in body)


def test_bad_settings_fail_in_one_line():
    cfg = load_config(None, ["bench.prefix_variants=[shared,fused]"], schema=BenchRun)
    with pytest.raises(ValueError, match="fused"):
        prefix.check(cfg)
    cfg = load_config(None, ["bench.prefix_group=1"], schema=BenchRun)
    with pytest.raises(ValueError, match="prefix_group"):
        prefix.check(cfg)


def test_the_step_reward_is_the_timing_one_for_random_weights():
    from embodied.bench.step import step_reward

    def reward(*overrides):
        return step_reward(load_config(None, list(overrides), schema=BenchRun))

    fn, what = reward("policy.path=random:qwen3.5-0.8b")
    assert what.startswith("timing")
    terms = fn(["", "", "", ""], [{}] * 4)
    values = [t["reward/total"] for t in terms]
    assert len(set(values)) == 4 and all(0 <= v < 1 for v in values)
    assert reward("policy.path=tiny-base") == (None, reward("bench.step_reward=mcq")[1])
    assert reward("policy.path=tiny-base", "bench.step_reward=timing")[1].startswith("timing")
    with pytest.raises(ValueError, match="step_reward"):
        reward("bench.step_reward=random")
