"""Tiny real training runs: parameters move, losses stay finite, the CLI runs end to end."""

import importlib.metadata
import json

import numpy as np
import pytest
import torch

from embodied.config import GRPOConfig, SFTConfig
from embodied.policy.model import load_policy
from embodied.train.grpo import train_grpo
from embodied.train.metrics import read_metrics
from embodied.train.sft import train_sft
from embodied.train.state import Run
from embodied.video import VideoConfig


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_sft_then_grpo_change_parameters_and_stay_finite(examples, tiny_path, tmp_path):
    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    before = _params(model)
    sft = SFTConfig(
        steps=40,
        batch_size=8,
        lr=3e-3,
        warmup_steps=5,
        log_every=5,
        eval_every=0,
        vision_lr_scale=1.0,
        rationale="template",
    )
    train_sft(sft, Run(model, processor, examples, tmp_path, progress=False))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    losses = [r["loss/sft"] for r in rows if "loss/sft" in r]
    assert all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0]
    after_sft = _params(model)
    assert any(not torch.equal(before[k], after_sft[k]) for k in before)

    grpo = GRPOConfig(
        steps=4,
        prompts_per_step=4,
        group_size=8,
        max_new_tokens=32,
        temperature=1.5,
        lr=1e-4,
        kl_coef=0.04,
        log_every=1,
    )
    train_grpo(grpo, Run(model, processor, examples, tmp_path, progress=False))
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "grpo"]
    assert len(rows) == 4
    for r in rows:
        assert all(np.isfinite(r[k]) for k in ("loss/policy", "loss/kl", "reward/total", "entropy/mean"))
    assert max(r["reward/format"] for r in rows) > 0  # SFT taught the format
    assert any(r["reward/group_spread"] > 0 for r in rows)  # some group had something to learn from
    after = _params(model)
    assert any(not torch.equal(after_sft[k], after[k]) for k in after)


def test_quickstart_cli_end_to_end(tmp_path, monkeypatch, capsys):
    from embodied.cli import main

    monkeypatch.chdir(tmp_path)
    rc = main(
        [
            "quickstart",
            "-q",
            "data.n_train=16",
            "data.n_val=4",
            "data.n_test=6",
            "data.workers=0",
            "sft.steps=6",
            "sft.batch_size=8",
            "sft.eval_every=0",
            "grpo.steps=2",
            "grpo.prompts_per_step=2",
            "grpo.group_size=4",
            "eval.max_new_tokens=16",
            "quickstart.grpo_eval_every=1",
        ]
    )
    assert rc == 0
    out = tmp_path / "runs" / "quickstart"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["stage"] == "grpo" and "eval/accuracy" in r] == [1, 2]  # held out
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["accuracy"]) == {"initial", "sft", "grpo"}
    assert summary["chance"] == 0.5 and summary["n_test"] == 6
    assert 0 <= summary["accuracy"]["grpo"] <= 1 and summary["wall_s"] > 0
    for name in (
        "curves.png",
        "examples/examples.png",
        "examples/examples.json",
        "eval_grpo.json",
        "sft_model/config.json",
        "grpo_model/model.safetensors",
    ):
        assert (out / name).is_file(), name
    assert (tmp_path / "data/generated/arrow_of_time/manifest.json").is_file()
    # results name what made them: versions, commit, and whether they were the lock's (issue 65)
    from embodied.environment import LOCK, compare, installed, read_lock

    ev = json.loads((out / "eval_grpo.json").read_text())["environment"]
    assert summary["environment"] == ev == json.loads((out / "environment.json").read_text())
    assert ev["packages"]["transformers"] == importlib.metadata.version("transformers")
    assert {"torch", "transformers", "peft", "accelerate", "mujoco"} <= set(ev["packages"])
    assert ev["embodied"]["commit"] and ev["lock"]["file"] == "locks/main.txt"
    assert ev["lock"]["matched"] == compare(read_lock(LOCK), installed())["matched"]


def test_param_groups_scale_only_the_vision_tower(tiny_path):
    from embodied.train.common import param_groups

    model, _ = load_policy(tiny_path)
    vision, text = param_groups(model, lr=1e-4, vision_lr_scale=30.0)
    assert vision["lr"] == pytest.approx(3e-3) and text["lr"] == pytest.approx(1e-4)
    named = dict(model.named_parameters())
    vision_ids = {id(p) for p in vision["params"]}
    assert vision_ids == {id(p) for n, p in named.items() if "visual" in n}
    assert len(vision["params"]) + len(text["params"]) == len(named)


def test_warm_restarts_reset_the_learning_rate_cycle(examples, tiny_path, tmp_path):
    model, processor = load_policy(tiny_path)
    sft = SFTConfig(
        steps=8,
        batch_size=4,
        lr=1e-4,
        vision_lr_scale=10.0,
        warmup_steps=2,
        restart_every=4,
        log_every=1,
        eval_every=0,
    )
    train_sft(sft, Run(model, processor, examples, tmp_path, progress=False))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    lr = [r["optim/lr_vision"] for r in rows]  # logged after each step
    assert [r["optim/lr"] for r in rows] == pytest.approx([x / 10 for x in lr])
    # logged after each scheduler step, cycle of 4, warmup 2: f(1)=1, f(2)=1 (cosine starts),
    # f(3) = 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55, f(4) = 0.1; the restart at step 5 starts over
    peak = 1e-3
    expected = [1.0, 1.0, 0.55, 0.1] * 2
    assert lr == pytest.approx([peak * f for f in expected])


def test_grpo_runs_with_every_switch_and_rejects_unknown_ones(examples, tiny_path, tmp_path):
    model, processor = load_policy(tiny_path)
    for adv, agg, kl in [
        ("rloo", "token-mean", "k2"),
        ("reinforce_pp", "seq-sum-norm", "k1"),
        ("drgrpo", "token-mean", "k3"),
    ]:
        cfg = GRPOConfig(
            steps=1,
            prompts_per_step=2,
            group_size=4,
            max_new_tokens=8,
            advantage=adv,
            loss_agg=agg,
            kl_estimator=kl,
            clip_eps_high=0.28,
            dual_clip=3.0,
            log_every=1,
        )
        train_grpo(cfg, Run(model, processor, examples, tmp_path / adv, progress=False))
        row = read_metrics(tmp_path / adv / "metrics.jsonl")[-1]
        assert np.isfinite(row["loss/policy"]) and np.isfinite(row["loss/kl"])
    with pytest.raises(ValueError, match="grpo.advantage"):
        train_grpo(GRPOConfig(advantage="ppo"), Run(model, processor, examples, tmp_path, progress=False))


def test_sft_stop_rules():
    from embodied.train.runner import Cadence, stops_here

    cfg = Cadence.of(SFTConfig(steps=10, stop_at=0.6))
    assert not stops_here(cfg, 3, None, 5.0)  # no validation this step
    assert not stops_here(cfg, 3, 0.59, 5.0)
    assert stops_here(cfg, 3, 0.6, 5.0)  # at or above
    assert stops_here(cfg, 10, None, 5.0)  # the last step
    assert not stops_here(Cadence.of(SFTConfig(steps=10)), 3, 1.0, 1e9)  # both rules off by default
    assert stops_here(Cadence.of(SFTConfig(steps=10, max_seconds=30)), 3, None, 30.0)
    assert not stops_here(Cadence.of(SFTConfig(steps=10, max_seconds=30)), 3, None, 29.9)


def test_sft_max_seconds_stops_after_the_step_that_runs_out(examples, tiny_path, tmp_path):
    model, processor = load_policy(tiny_path)
    cfg = SFTConfig(steps=50, batch_size=4, log_every=1, eval_every=0, checkpoint_every=10, max_seconds=1e-6)
    done = train_sft(cfg, Run(model, processor, examples, tmp_path, progress=False))
    assert done["steps"] == 1
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]
    assert (tmp_path / "checkpoints" / "sft" / "step-00000001").is_dir()  # the last step is checkpointed


def test_rl_curves_and_first_reaching_from_metrics_rows():
    from embodied.train.metrics import first_reaching, rl_curves

    rows = [
        {
            "step": 5,
            "reward/total": 1.2,
            "reward/accuracy": 0.5,
            "reward/group_spread": 0.75,
            "entropy/mean": 0.2,
        },
        {"step": 5, "eval/accuracy": 0.8, "time/elapsed": 10.04},
        {"step": 10, "reward/total": 1.5, "reward/group_spread": 0.25, "papo/accuracy_masked": 0.4},
        {"step": 10, "eval/accuracy": 0.95, "time/elapsed": 20.06},
    ]
    c = rl_curves(rows, start_val=0.5)
    assert c["val"] == [(0, 0.0, 0.5), (5, 10.04, 0.8), (10, 20.06, 0.95)]
    assert c["reward"] == [(5, 0.5), (10, 1.5)]  # accuracy where scored, else the total
    assert c["group_spread"] == [(5, 0.75), (10, 0.25)] and c["entropy"] == [(5, 0.2)]
    assert c["papo_masked"] == [(10, 0.4)] and c["papo_real"] == []
    assert first_reaching(c["val"], 0.9) == (10, 20.1) and first_reaching(c["val"], 0.99) == (None, None)


def test_answer_weight_lands_on_the_answer_tokens_only(tiny_path):
    """`sft.answer_weight` weighs exactly the tokens inside `<answer>...</answer>`; 1 is the plain mean."""
    from transformers import AutoProcessor

    from embodied.policy.model import encode_completions
    from embodied.train.sft import answer_weights

    processor = AutoProcessor.from_pretrained(tiny_path)
    texts = [
        "<think>3 1 2 -> 2, 3, 1</think><answer>B</answer>",
        "<think></think><answer>C</answer>",
        "no tags",
    ]
    ids, mask = encode_completions(processor, texts)
    w = answer_weights(processor, texts, mask, 10.0)
    assert torch.equal(w == 0, mask == 0)  # padding stays out
    for i, want in enumerate(["B", "C", ""]):
        heavy = ids[i][w[i] == 10.0]
        assert processor.tokenizer.decode(heavy) == want
    assert torch.equal(answer_weights(processor, texts, mask, 1.0), mask.float())


def test_format_targets_never_carry_a_trace():
    """Format-only SFT (random letters) must not teach the answer through `<think>`: a puzzle's trace lists
    the shown pieces' places, which decide the answer."""
    from embodied.data.families import FamilySpec
    from embodied.questions import spatial_puzzle as sp
    from embodied.train.sft import sft_targets

    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    rec, _ = sp.from_frames(image[None], 2.0, np.random.default_rng(0), 2, "easy", FamilySpec())
    answer = sft_targets([rec], SFTConfig(rationale="trace", targets="answer"), 0, 1)[0]
    assert "->" in answer
    for step in range(1, 6):
        (fmt,) = sft_targets([rec], SFTConfig(rationale="trace", targets="format"), 0, step)
        assert fmt.startswith("<think></think><answer>")


def test_text_answers_write_the_option_and_score_as_its_letter():
    """`sft.answer_as=text` writes the right option's text in `<answer>`, and evaluation reads it back as
    that option's letter."""
    from embodied.data.families import FamilySpec
    from embodied.questions import chosen_option, sft_target
    from embodied.questions import spatial_puzzle as sp
    from embodied.train.sft import sft_targets

    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    rec, _ = sp.from_frames(image[None], 2.0, np.random.default_rng(0), 2, "easy", FamilySpec())
    (target,) = sft_targets([rec], SFTConfig(rationale="trace", answer_as="text"), 0, 1)
    assert target.endswith(f"<answer>{rec['options'][2]}</answer>")
    assert chosen_option(target, rec["options"]) == "C" == rec["answer"]
    for step in range(1, 6):  # format targets: a random option, written out
        (fmt,) = sft_targets([rec], SFTConfig(answer_as="text", targets="format"), 0, step)
        assert chosen_option(fmt, rec["options"]) in "ABCD" and "<answer>C</answer>" not in fmt
    with pytest.raises(ValueError, match="answer_as"):
        sft_target(rec, "none", "number")
    # `order` spells only orders: the arrangement's order here, a letter where the options are no orders
    assert sft_target(rec, "none", "order") == f"<think></think><answer>{rec['options'][2]}</answer>"
    patch, _ = sp.from_frames(
        image[None], 2.0, np.random.default_rng(0), 1, "easy", FamilySpec(variant="patch")
    )
    assert sft_target(patch, "none", "order") == "<think></think><answer>B</answer>"
    assert sft_target(patch, "none", "text") == f"<think></think><answer>{patch['options'][1]}</answer>"


def test_rationale_families_choose_who_carries_the_trace(tiny_path):
    """`sft.rationale_families` keeps the trace on the listed families and leaves `<think>` empty on the
    others; an unknown family name is an error, not a silent `none`."""
    from embodied.data.families import FamilySpec
    from embodied.questions import spatial_puzzle as sp
    from embodied.train.sft import longest_target, sft_targets

    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    puzzle, _ = sp.from_frames(image[None], 2.0, np.random.default_rng(0), 2, "easy", FamilySpec())
    other = puzzle | {"family": "arrow_of_time", "options": ["forward", "backward"], "answer": "A"}
    every = SFTConfig(rationale="trace")
    only = SFTConfig(rationale="trace", rationale_families=["spatial_puzzle"])
    assert [t.startswith("<think></think>") for t in sft_targets([puzzle, other], every, 0, 1)] == [False] * 2
    kept, bare = sft_targets([puzzle, other], only, 0, 1)
    assert "->" in kept and bare == "<think></think><answer>A</answer>"
    assert sft_targets([puzzle], only, 0, 1) == sft_targets([puzzle], every, 0, 1)
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_path)
    assert longest_target(processor, [other], only) < longest_target(processor, [other], every)
    with pytest.raises(ValueError, match="spatial_puzzles"):
        sft_targets([puzzle], SFTConfig(rationale="trace", rationale_families=["spatial_puzzles"]), 0, 1)
    # format targets (a random letter) never carry a trace, and follow the families for a template
    template = SFTConfig(targets="format", rationale="template", rationale_families=["spatial_puzzle"])
    on_puzzle, on_other = sft_targets([puzzle, other], template, 0, 1)
    assert not on_puzzle.startswith("<think></think>") and on_other.startswith("<think></think>")
    assert all(
        t.startswith("<think></think>")
        for t in sft_targets([puzzle], SFTConfig(targets="format", rationale="trace"), 0, 1)
    )
    with pytest.raises(ValueError, match="spatial_puzzles"):
        sft_targets([puzzle], SFTConfig(targets="format", rationale_families=["spatial_puzzles"]), 0, 1)


def test_sft_micro_batches_sort_by_length_trim_padding_and_keep_the_update(examples, tiny_path, tmp_path):
    """`sft.micro_batch_size`: micro-batches of rows of similar prompt length, each without the padding no
    row of it needs, accumulate the whole batch's update (up to float rounding)."""
    from embodied.data.load import Example
    from embodied.policy.model import encode_completions, encode_examples
    from embodied.train.sft import sft_micro_batches

    # prompts of 8 lengths, shuffled, so sorting and trimming both do something
    pad = [3, 0, 6, 1, 7, 2, 5, 4]
    varied = [
        Example(e.record | {"question": e.record["question"] + " Look closely." * n}, e.clip)
        for e, n in zip(examples[:8], pad)
    ]
    _, processor = load_policy(tiny_path)
    batch = encode_examples(processor, varied, VideoConfig())
    ids, mask = encode_completions(processor, ["<answer>A</answer>", "<think>a longer one</think>"] * 4)
    parts = list(sft_micro_batches(batch, ids, mask, mask.float(), 3))
    lengths = batch["attention_mask"].sum(1)
    assert [p[0]["input_ids"].shape[0] for p in parts] == [3, 3, 2]
    widths = [p[0]["input_ids"].shape[1] for p in parts]
    assert widths == sorted(widths) and widths[0] < batch["input_ids"].shape[1]  # shortest first, trimmed
    for p in parts:  # no all-padding column is left, and every row keeps its clip's pixels
        assert int(p[0]["attention_mask"].sum(1).max()) == p[0]["input_ids"].shape[1]
        assert p[0]["pixel_values_videos"].shape[0] == batch["pixel_values_videos"].shape[0] // 8 * len(p[1])
    assert sorted(int(x) for p in parts for x in p[0]["attention_mask"].sum(1)) == sorted(lengths.tolist())
    assert len(list(sft_micro_batches(batch, ids, mask, mask.float(), 0))) == 1

    after = []
    for mb in (0, 3):
        torch.manual_seed(0)
        model, processor = load_policy(tiny_path)
        cfg = SFTConfig(steps=2, batch_size=8, lr=1e-3, warmup_steps=1, log_every=1, eval_every=0)
        cfg.micro_batch_size, cfg.rationale, cfg.checkpoint_every = mb, "template", 0
        train_sft(cfg, Run(model, processor, varied, tmp_path / f"mb{mb}", progress=False))
        losses = [r["loss/sft"] for r in read_metrics(tmp_path / f"mb{mb}" / "metrics.jsonl")]
        after.append((losses, _params(model)))
    (l0, p0), (l3, p3) = after
    assert l3 == pytest.approx(l0, abs=1e-6)
    # the logged loss checks the normalisation (Adam would hide a scale); the weights check the direction:
    # two Adam steps of 1e-3 differ by float rounding only (3.5e-6 at most here), a lost row by ~1e-3
    assert all(torch.allclose(p0[k], p3[k], atol=1e-5) for k in p0)
    moved = load_policy(tiny_path)[0]
    assert any(not torch.equal(p0[k], v) for k, v in _params(moved).items())


def test_sft_micro_batch_size_must_not_be_negative(examples, tiny_path, tmp_path):
    model, processor = load_policy(tiny_path)
    cfg = SFTConfig(steps=1, batch_size=4, eval_every=0)
    cfg.micro_batch_size = -1
    with pytest.raises(ValueError, match="micro_batch_size"):
        train_sft(cfg, Run(model, processor, examples, tmp_path, progress=False))


def test_with_last_flags_only_the_final_item_and_reads_one_ahead():
    from embodied.train.common import with_last

    assert list(with_last([])) == []
    assert list(with_last("a")) == [("a", True)]
    assert list(with_last(iter("abc"))) == [("a", False), ("b", False), ("c", True)]
    drawn = []

    def parts():
        for i in range(3):
            drawn.append(i)
            yield i

    it = with_last(parts())
    assert next(it) == (0, False) and drawn == [0, 1]  # one ahead, not the whole generator


def test_keep_best_ends_on_the_best_held_out_weights(examples, tiny_path, tmp_path):
    """`grpo.keep_best`: the run ends on the weights of its best validation point (the latest of equals)."""
    from embodied.train.runner import BestWeights

    model, _ = load_policy(tiny_path)
    best, name = BestWeights(), next(iter(dict(model.named_parameters())))
    param = dict(model.named_parameters())[name]
    with torch.no_grad():
        best.see(1, 0.5, model)
        kept = param.detach().clone()
        param.add_(1.0)
        best.see(2, 0.4, model)  # worse: not kept
        param.add_(1.0)
        best.restore(model)
    assert best.step == 1 and torch.equal(param, kept)
    with torch.no_grad():
        param.add_(1.0)
        best.see(3, 0.5, model)  # equal: the later one is kept
        later = param.detach().clone()
        param.add_(1.0)
        best.restore(model)
    assert best.step == 3 and torch.equal(param, later)

    model, processor = load_policy(tiny_path)
    cfg = GRPOConfig(steps=3, prompts_per_step=2, group_size=2, max_new_tokens=8, log_every=1)
    cfg.eval_every, cfg.eval_examples, cfg.keep_best = 2, 4, True
    run = train_grpo(cfg, Run(model, processor, examples, tmp_path, val=examples, progress=False))
    held = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "eval/accuracy" in r]
    assert [r["step"] for r in held] == [2, 3]  # every eval_every steps, and the last step
    accuracies = {r["step"]: r["eval/accuracy"] for r in held}
    assert run["best_step"] == max(accuracies, key=lambda s: (accuracies[s], s))
    cfg.eval_every = 0
    with pytest.raises(ValueError, match="grpo.keep_best needs grpo.eval_every"):
        train_grpo(cfg, Run(model, processor, examples, tmp_path, val=examples, progress=False))
