"""GRPO recipes (PPO's critic included) on the real tiny model, and training state: resume equals an
uninterrupted run, a crash mid-save leaves the previous checkpoint, micro-batching and seeds do not change
results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from grpo_configs import critic_with, grpo_config, grpo_step
from safetensors.torch import load_file

from embodied.config import GRPOConfig, SFTConfig
from embodied.data.load import Example
from embodied.policy.model import load_policy
from embodied.questions import arrow_of_time
from embodied.train.checkpoint import (
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
    set_aside,
)
from embodied.train.grpo import sampling_args, train_grpo
from embodied.train.metrics import read_metrics
from embodied.train.sft import train_sft
from embodied.train.state import Run
from embodied.video import Clip, VideoConfig


def synthetic_examples(n: int = 12, seed: int = 0) -> list[Example]:
    """Arrow-of-time records over random 4-frame clips: enough to exercise every code path quickly."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        frames = rng.integers(0, 255, (4, 56, 56, 3), dtype=np.uint8)
        record = {
            "id": f"s-{i}",
            "family": arrow_of_time.NAME,
            "video": f"{i}.mp4",
            "question": arrow_of_time.QUESTION,
            "options": list(arrow_of_time.OPTIONS),
            "answer": "AB"[i % 2],
            "meta": {"difficulty": "easy"},
        }
        out.append(Example(record, Clip(frames, 2.0)))
    return out


@pytest.fixture(scope="module")
def examples():
    return synthetic_examples()


def _grpo(**kw) -> GRPOConfig:
    base = dict(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=8, log_every=1, checkpoint_every=0)
    return grpo_config(base, kw)


def _rows(path, stage="grpo"):
    return [r for r in read_metrics(path / "metrics.jsonl") if r["stage"] == stage]


def varied_reward(texts, records):
    """A reward with spread even for an untrained policy (its answers are unparseable): the text's length."""
    return [{"reward/total": float(len(t) % 3), "reward/accuracy": float(len(t) % 2)} for t in texts]


def _no_time(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


# the PPO preset file itself, as `-c configs/recipes/ppo.yaml` would layer it
PPO_PRESET = yaml.safe_load((Path(__file__).parents[1] / "configs/recipes/ppo.yaml").read_text())["grpo"]

RECIPES = {
    "dapo": dict(
        loss_agg="token-mean",
        clip_eps_high=0.28,
        kl_coef=0.0,
        dynamic_sampling=True,
        max_sampling_rounds=2,
        overlong={"mode": "soft", "buffer": 4},
        temperature=1.5,
    ),
    "dapo_masked": dict(loss_agg="token-mean", kl_coef=0.0, overlong={"mode": "hard"}, mask_truncated=True),
    "drgrpo": dict(advantage="drgrpo", loss_agg="seq-sum-norm"),
    "papo": dict(papo={"enabled": True, "consistent": False}, loss_agg="token-mean"),
    "entropy": dict(
        cov={"mode": "kl_cov"},
        entropy_coef=0.01,
        ratio_level="sequence",
        updates_per_rollout=2,
        micro_batch_size=3,
        temperatures=[0.7, 1.0, 1.3, 1.6],
        overlong={"mode": "hard"},
    ),
    "clip_cov": dict(
        cov={"mode": "clip_cov", "clip_low": -10.0, "clip_high": 10.0},
        papo={"enabled": True, "masked_grad": True},
    ),
    # the critic's warm-up cut to 1 step, so step 2 moves the policy
    "ppo": PPO_PRESET | {"ppo": PPO_PRESET["ppo"] | {"value_warmup_steps": 1}},
    # classic PPO: one answer per prompt, no group baseline; micro-batches; no reference model; token values
    "ppo_g1": dict(
        advantage="gae",
        group_size=1,
        prompts_per_step=4,
        micro_batch_size=3,
        kl_coef=0.0,
        ppo={"value_warmup_steps": 1, "value_level": "token"},
    ),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_trains_and_logs(name, examples, tiny_path, tmp_path):
    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = _grpo(**RECIPES[name])
    train_grpo(cfg, Run(model, processor, examples, tmp_path, progress=False, reward_fn=varied_reward))
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    last = rows[-1]
    expected = {
        "dapo": ["sampling/rounds", "sampling/kept_groups", "reward/overlong", "rollout/truncated"],
        "dapo_masked": ["rollout/truncated", "reward/overlong"],
        "drgrpo": ["loss/policy", "loss/kl"],
        "papo": [
            "loss/perception",
            "entropy/real",
            "entropy/masked",
            "papo/accuracy_real",
            "papo/accuracy_masked",
        ],
        "entropy": ["loss/entropy", "clip/cov_fraction", "reward/overlong"],
        "clip_cov": ["clip/cov_fraction", "loss/perception"],
        "ppo": ["loss/value", "clip/value_fraction", "critic/explained_variance", "critic/kl_reward"],
        "ppo_g1": ["loss/value", "critic/value_mean", "critic/return_mean"],
    }[name]
    for key in expected:
        assert key in last, key
        assert np.isfinite(last[key]), (key, last[key])
    if name in ("entropy", "clip_cov"):
        assert last["clip/cov_fraction"] > 0  # some tokens were selected
    if name == "dapo":  # only groups with reward spread were kept
        assert last["sampling/kept_groups"] == 2 and last["reward/group_spread"] == 1.0
    if name == "ppo":  # the KL is in the reward, not in the loss
        assert last["loss/kl"] == 0.0 and last["critic/kl_reward"] != 0.0
    if name.startswith("ppo"):  # the critic moved: its values are no longer the zero of its init
        assert last["critic/value_mean"] != 0.0 and last["loss/value"] > 0.0
    changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    if name == "dapo_masked" and all(r["rollout/truncated"] == 1.0 for r in rows):
        # the untrained policy never ends within 8 tokens: every sample is masked out, nothing may move
        assert not changed and last["reward/overlong"] == -1.0
        return
    assert changed


def test_per_member_temperatures_score_each_sample_at_its_own(tiny_policy, examples):
    from embodied.policy.model import completion_logprobs, encode_prompts, generate, repeat_batch

    model, processor = tiny_policy
    batch = repeat_batch(
        encode_prompts(processor, [examples[0].record], [examples[0].clip], VideoConfig()), 2
    )
    temps = torch.tensor([0.5, 2.0])
    torch.manual_seed(0)
    ids, mask = generate(model, processor, batch, 6, temps)
    lp_rows = completion_logprobs(model, batch, ids, mask, temps)
    for i, t in enumerate(temps.tolist()):  # row i's log-probs are those at temperature t
        lp_i = completion_logprobs(model, batch, ids, mask, t)[i]
        assert torch.allclose(lp_rows[i], lp_i, atol=1e-5)
    assert not torch.allclose(lp_rows[0], completion_logprobs(model, batch, ids, mask, 2.0)[0], atol=1e-3)


def test_seeded_sampler_draws_from_the_softmax_and_never_a_masked_token():
    from embodied.policy.model import _RowSeededSampler

    p = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    logits = torch.log(p).expand(2, -1).clone()  # two rows, the last token impossible (-inf)
    draws = torch.stack([_RowSeededSampler([7, 8], torch.device("cpu"))(None, logits).argmax(-1)])
    counts = torch.zeros(2, 5)
    sampler = _RowSeededSampler([7, 8], torch.device("cpu"))
    for _ in range(4000):
        picks = sampler(None, logits)
        assert torch.isfinite(picks).sum() == 2  # one possible token per row
        counts[torch.arange(2), picks.argmax(-1)] += 1
    assert counts[:, 4].sum() == 0
    assert torch.allclose(counts / 4000, p.expand(2, -1), atol=0.03)  # 4.5 standard errors at most
    assert torch.equal(draws[0], _RowSeededSampler([7, 8], torch.device("cpu"))(None, logits).argmax(-1))


def test_seeded_samples_do_not_depend_on_the_rest_of_the_batch(tiny_policy, examples):
    """What makes GRPO over several processes equal one process: a prompt's answers depend on its seed."""
    from embodied.rl.rollout import sample_groups

    model, processor = tiny_policy
    cfg = _grpo(temperatures=[0.7, 1.3])
    seeds = [11, 22, 33]
    together = sample_groups(
        model, processor, examples[:3], VideoConfig(), varied_reward, sampling_args(cfg), seeds=seeds
    )
    G = cfg.group_size
    for i in range(3):
        torch.manual_seed(100 + i)  # the global RNG plays no part
        alone = sample_groups(
            model,
            processor,
            [examples[i]],
            VideoConfig(),
            varied_reward,
            sampling_args(cfg),
            seeds=seeds[i : i + 1],
        )
        rows = together.mask[i * G : (i + 1) * G]
        T = min(alone.ids.shape[1], together.ids.shape[1])  # the batch pads to its longest answer
        assert rows[:, T:].sum() == alone.mask[:, T:].sum() == 0
        assert torch.equal(alone.mask[:, :T], rows[:, :T])
        assert torch.equal((alone.ids * alone.mask)[:, :T], (together.ids[i * G : (i + 1) * G] * rows)[:, :T])
    other = sample_groups(
        model, processor, examples[:1], VideoConfig(), varied_reward, sampling_args(cfg), seeds=[12]
    )
    assert not torch.equal(other.ids, together.ids[:G])  # another seed, other answers


def test_micro_batches_give_the_same_loss_and_gradient(examples, tiny_policy):
    from embodied.rl.advantages import Estimate, compute_advantages
    from embodied.rl.rollout import sample_groups

    model, processor = tiny_policy
    torch.manual_seed(0)
    cfg = _grpo(
        loss_agg="token-mean",
        entropy_coef=0.01,
        papo={"enabled": True},
        kl_coef=0.0,
        overlong={"mode": "hard"},
    )
    ro = sample_groups(model, processor, examples[:2], VideoConfig(), varied_reward, sampling_args(cfg))
    est = Estimate(compute_advantages(ro.rewards, cfg.advantage).flatten())
    results = []
    for mb in (0, 3):  # the whole rollout (8 rows) vs uneven micro-batches of 3, 3, 2
        cfg.micro_batch_size = mb
        model.zero_grad(set_to_none=True)
        # the same PAPO masks for both: a fresh generator with the same seed
        metrics = grpo_step(model, processor, cfg).update(ro, est, torch.Generator().manual_seed(0))
        grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        results.append((metrics, grads))
    model.zero_grad(set_to_none=True)
    (m0, g0), (m3, g3) = results
    assert m3 == pytest.approx(m0, abs=1e-6)
    assert len(g0) == len(g3) > 0
    assert all(torch.allclose(a, b, atol=1e-7, rtol=1e-4) for a, b in zip(g0, g3))


def test_ppo_values_read_the_state_before_each_token(tiny_policy, examples):
    from embodied.policy.model import completion_logprobs, completion_outputs, encode_prompts, repeat_batch
    from embodied.rl.ppo import ValueHead

    model, processor = tiny_policy
    prompt = encode_prompts(processor, [examples[0].record], [examples[0].clip], VideoConfig())
    batch = repeat_batch(prompt, 2)
    ids = torch.randint(20, 90, (2, 6), generator=torch.Generator().manual_seed(0))  # no vision token
    mask = torch.ones(2, 6, dtype=torch.long)
    torch.manual_seed(0)
    head = ValueHead(model.config.text_config.hidden_size, init_std=0.1)
    logp, _, values = completion_outputs(model, batch, ids, mask, value_head=head)
    assert values.shape == (2, 6) and values.requires_grad
    # the full pass the values need gives the log-probs of the grouped batch's shared-prefix pass
    assert torch.allclose(logp, completion_logprobs(model, batch, ids, mask), atol=1e-5)
    changed = ids.clone()
    changed[:, 3] = 20 + (ids[:, 3] - 20 + 7) % 70
    values2 = completion_outputs(model, batch, changed, mask, value_head=head).values
    # values[:, t] is V(prompt + completion[:t]): a new token 3 leaves V_0..V_3 alone and moves V_4 on
    assert torch.allclose(values2[:, :4], values[:, :4], atol=1e-6)
    assert (values2[:, 4] - values[:, 4]).abs().min() > 1e-4


def test_ppo_value_head_gets_gradient_and_learns_a_fixed_rollout(tiny_path, examples):
    from embodied.rl.advantages import Context
    from embodied.rl.rollout import sample_groups

    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    # lambda = 1: the returns are each answer's reward on every token, whatever the values (a fixed target);
    # the policy barely moves (lr 1e-6), the head learns at 3e-3
    ppo = {"lam": 1.0, "value_lr_scale": 3e3, "vf_coef": 1.0, "value_level": "token"}
    cfg = _grpo(advantage="gae", kl_coef=0.0, lr=1e-6, ppo=ppo)
    ro = sample_groups(model, processor, examples[:2], VideoConfig(), varied_reward, sampling_args(cfg))
    t = grpo_step(model, processor, cfg)
    head = t.estimator.value_head
    est = t.estimator.estimate(ro, Context(model, None, ro.mask))
    assert est.advantages.shape == ro.ids.shape and torch.equal(
        est.old_values, torch.zeros_like(ro.mask.float())
    )
    t.update(ro, est, torch.Generator())
    assert head.linear.weight.grad.abs().sum() > 0 and head.linear.bias.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)
    head.zero_grad(set_to_none=True)
    losses = [
        t.learn(ro, step)["loss/value"]
        for step in range(1, 26)  # a layer of its own on detached features: slower than the linear head
    ]
    assert losses[0] > 0.1
    assert losses[-1] < 0.3 * losses[0], losses


def test_ppo_micro_batches_give_the_same_loss_and_gradient(examples, tiny_policy):
    from embodied.rl.advantages import Context
    from embodied.rl.ppo import ValueHead
    from embodied.rl.rollout import sample_groups

    model, processor = tiny_policy
    torch.manual_seed(0)
    cfg = _grpo(advantage="gae", kl_coef=0.0, loss_agg="token-mean")
    ro = sample_groups(model, processor, examples[:2], VideoConfig(), varied_reward, sampling_args(cfg))
    head = ValueHead(model.config.text_config.hidden_size, init_std=0.05)  # its gradient reaches the backbone
    t = grpo_step(model, processor, cfg, critic_with(cfg, model, head))
    est = t.estimator.estimate(ro, Context(model, None, ro.mask))
    results = []
    for mb in (0, 3):  # the whole rollout (8 rows) vs uneven micro-batches of 3, 3, 2
        cfg.micro_batch_size = mb
        model.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        metrics = t.update(ro, est, torch.Generator())
        params = [*model.parameters(), *head.parameters()]
        results.append((metrics, [p.grad.detach().clone() for p in params if p.grad is not None]))
    model.zero_grad(set_to_none=True)
    (m0, g0), (m3, g3) = results
    assert m3 == pytest.approx(m0, abs=1e-6) and m0["loss/value"] > 0
    assert len(g0) == len(g3) > 0
    assert all(torch.allclose(a, b, atol=1e-7, rtol=1e-4) for a, b in zip(g0, g3))


def test_same_seed_gives_identical_metrics(examples, tiny_path, tmp_path):
    for run in ("a", "b"):
        torch.manual_seed(0)
        model, processor = load_policy(tiny_path)
        cfg = _grpo(**RECIPES["papo"])
        out = tmp_path / run
        train_grpo(cfg, Run(model, processor, examples, out, seed=3, progress=False, reward_fn=varied_reward))
    a, b = (list(map(_no_time, _rows(tmp_path / r))) for r in ("a", "b"))
    assert a == b


class Crash(Exception):
    pass


def _crash_and_resume(cfg: GRPOConfig, examples, tiny_path, tmp_path, monkeypatch) -> None:
    """Run `cfg` (4 steps, a checkpoint every 2) straight into `full`, and into `cut` with a crash right after
    the step-2 checkpoint and a resume in a fresh process state: every logged metric and the final weights
    must be the uninterrupted run's."""
    import embodied.train.checkpoint as ckpt_mod

    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    kw = dict(progress=False, reward_fn=varied_reward)
    train_grpo(cfg, Run(model, processor, examples, tmp_path / "full", **kw))
    full = [p.detach().clone() for p in model.parameters()]

    real_save = ckpt_mod.save_checkpoint

    def save_then_crash(root, step, *a, **k):
        real_save(root, step, *a, **k)
        if step == 2:
            raise Crash  # the process dies right after the step-2 checkpoint

    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    monkeypatch.setattr(ckpt_mod, "save_checkpoint", save_then_crash)
    with pytest.raises(Crash):
        train_grpo(cfg, Run(model, processor, examples, tmp_path / "cut", **kw))
    monkeypatch.setattr(ckpt_mod, "save_checkpoint", real_save)
    torch.manual_seed(123)  # whatever the new process's RNG: the checkpoint restores it
    model, processor = load_policy(tiny_path)
    train_grpo(cfg, Run(model, processor, examples, tmp_path / "cut", resume="auto", **kw))
    resumed = [p.detach().clone() for p in model.parameters()]

    a, b = (list(map(_no_time, _rows(tmp_path / r))) for r in ("full", "cut"))
    assert [r["step"] for r in b] == [1, 2, 3, 4]  # the resumed run did not log twice
    for ra, rb in zip(a, b):
        assert set(ra) == set(rb)
        for k in ra:
            assert rb[k] == pytest.approx(ra[k], abs=1e-6), (ra["step"], k)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(full, resumed))


def test_grpo_resume_equals_uninterrupted_run(examples, tiny_path, tmp_path, monkeypatch):
    cfg = _grpo(steps=4, checkpoint_every=2, dynamic_sampling=True, max_sampling_rounds=2, kl_coef=0.04)
    _crash_and_resume(cfg, examples, tiny_path, tmp_path, monkeypatch)


def test_ppo_resume_equals_uninterrupted_run(examples, tiny_path, tmp_path, monkeypatch):
    """The value head and its optimizer state come back too: steps 3 and 4 use the restored critic."""
    # steps 2-4 move the policy
    cfg = _grpo(steps=4, checkpoint_every=2, group_size=2, **PPO_PRESET)
    cfg.updates_per_rollout, cfg.ppo.value_warmup_steps = 2, 1
    _crash_and_resume(cfg, examples, tiny_path, tmp_path, monkeypatch)
    heads = [
        load_file(str(tmp_path / run / "checkpoints/grpo/step-00000004/value_head.safetensors"))
        for run in ("full", "cut")
    ]
    assert heads[0]["linear.weight"].abs().sum() > 0  # the head trained away from its zero init
    assert all(torch.allclose(heads[0][k], heads[1][k], atol=1e-6) for k in heads[0])


def test_checkpoint_rotation_and_rng_round_trip(tiny_path, tmp_path):
    model, _ = load_policy(tiny_path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, opt, state={"drawn": step}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    (tmp_path / ".tmp-step-00000004-1").mkdir()  # a crashed write is never picked up
    assert resolve_resume("auto", tmp_path).name == "step-00000003"
    assert resolve_resume("", tmp_path) is None and resolve_resume("auto", tmp_path / "none") is None
    with pytest.raises(FileNotFoundError, match="missing"):
        resolve_resume(str(tmp_path / ".tmp-step-00000004-1"), tmp_path)
    torch.manual_seed(5)
    np.random.seed(5)
    path = save_checkpoint(tmp_path, 9, model, opt, keep=5)
    want = (torch.rand(3), np.random.rand(3))
    torch.manual_seed(0)
    np.random.seed(0)
    assert load_checkpoint(path, model, opt)["step"] == 9
    assert torch.equal(torch.rand(3), want[0]) and np.array_equal(np.random.rand(3), want[1])
    # a fresh run in this folder moves these aside: its step 1 must not rotate out under the old step 9
    aside = set_aside(tmp_path)
    assert aside == tmp_path.with_name(tmp_path.name + ".previous") and list_checkpoints(tmp_path) == []
    assert [p.name for p in list_checkpoints(aside)][-1] == "step-00000009"
    save_checkpoint(tmp_path, 1, model, opt, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000001"]
    assert set_aside(tmp_path, main=False) is None and len(list_checkpoints(tmp_path)) == 1


KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys, torch
    sys.path.insert(0, {tests!r})
    import embodied.train.checkpoint as ck
    from test_training_state import synthetic_examples
    from embodied.config import SFTConfig
    from embodied.policy.model import load_policy
    from embodied.train.sft import train_sft
    from embodied.train.state import Run

    real = ck.torch.save
    def dying_save(obj, path, *a, **k):
        if "step-00000004" in str(path):  # half-way through writing the step-4 checkpoint
            open(path, "wb").write(b"partial")
            os.kill(os.getpid(), signal.SIGKILL)
        return real(obj, path, *a, **k)
    ck.torch.save = dying_save
    torch.set_num_threads({threads})  # the parent's: another thread count sums in another order
    torch.manual_seed(0)
    model, processor = load_policy({model!r})
    cfg = SFTConfig(**{cfg!r})
    train_sft(cfg, Run(model, processor, synthetic_examples(), {out!r}, progress=False))
    """
)


def test_sft_killed_during_checkpoint_write_resumes_from_the_previous_one(tiny_path, tmp_path, examples):
    cfg = dict(
        steps=6,
        batch_size=4,
        lr=1e-3,
        warmup_steps=1,
        restart_every=3,
        log_every=1,
        eval_every=0,
        checkpoint_every=2,
    )
    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    train_sft(SFTConfig(**cfg), Run(model, processor, examples, tmp_path / "full", progress=False))
    full = [p.detach().clone() for p in model.parameters()]

    cut = tmp_path / "cut"
    script = KILLED_RUN.format(
        tests=os.path.dirname(__file__),
        model=str(tiny_path),
        cfg=cfg,
        out=str(cut),
        threads=torch.get_num_threads(),  # an earlier test's `threads=1` may have set the parent's
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]  # SIGKILL, mid-write
    ckroot = cut / "checkpoints" / "sft"
    assert any(p.name.startswith(".tmp-step-00000004") for p in ckroot.iterdir())  # the torn write is there
    assert [p.name for p in list_checkpoints(ckroot)] == ["step-00000002"]  # ... and ignored

    torch.manual_seed(99)
    model, processor = load_policy(tiny_path)
    train_sft(SFTConfig(**cfg), Run(model, processor, examples, cut, progress=False, resume="auto"))
    resumed = [p.detach().clone() for p in model.parameters()]
    a, b = (list(map(_no_time, _rows(d, "sft"))) for d in (tmp_path / "full", cut))
    assert [r["step"] for r in b] == list(range(1, 7))
    assert [r["loss/sft"] for r in b] == pytest.approx([r["loss/sft"] for r in a], abs=1e-6)
    assert [r["optim/lr"] for r in b] == pytest.approx([r["optim/lr"] for r in a], abs=1e-12)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(full, resumed))
    assert json.loads((ckroot / "step-00000006" / "state.json").read_text())["step"] == 6


def test_recipe_comparison_experiment_end_to_end(tmp_path, monkeypatch):
    """Two seeds' starts (format SFT, then labelled SFT stopped by validation), two arms each, the table
    over seeds, the plot; a rerun reuses every start and run."""
    from embodied.cli import main

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.chdir(tmp_path)
    arms = f"[{repo}/configs/recipes/grpo.yaml,{repo}/configs/recipes/papo.yaml]"
    args = (
        ["experiment", "recipes", "-q", "-c", f"{repo}/configs/experiment_recipes.yaml", "run_dir=out"]
        + ["data.n_train=8", "data.n_val=4", "data.n_test=4", "data.workers=0", "sft.batch_size=4"]
        + ["grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.max_new_tokens=8", "grpo.log_every=1"]
        + ["recipes.format_steps=2", "recipes.half_max_steps=3", "recipes.half_eval_examples=2"]
        + ["recipes.steps=2", "recipes.eval_every=1", "recipes.seeds=[0,1]", "recipes.workers=1"]
        + [f"recipes.arms={arms}"]
    )
    assert main(args) == 0
    result = json.loads((tmp_path / "out" / "recipes.json").read_text())
    assert [(r["arm"], r["seed"]) for r in result["runs"]] == [
        ("grpo", 0),
        ("grpo", 1),
        ("papo", 0),
        ("papo", 1),
    ]
    for start in result["starts"]:  # stopped at the first validation >= 0.6, or after all 3 steps
        assert 1 <= start["labelled_steps"] <= 3
        assert Path(start["policy"]).is_dir()
    for run in result["runs"]:
        assert [s for s, _, _ in run["curves"]["val"]] == [0, 1, 2] and 0 <= run["test_accuracy"] <= 1
    summary = {s["arm"]: s for s in result["summary"]}
    assert summary["papo"]["papo_masked"] is not None and summary["grpo"]["papo_masked"] is None
    lo, hi = summary["grpo"]["test_ci95"]
    assert lo <= summary["grpo"]["test_mean"] <= hi and summary["grpo"]["seeds"] == 2
    assert (tmp_path / "out" / "recipes.png").stat().st_size > 0
    text = (tmp_path / "out" / "recipes.md").read_text()
    assert "| papo |" in text and "masked input" in text
    assert main(args) == 0
    again = json.loads((tmp_path / "out" / "recipes.json").read_text())
    assert again["runs"] == result["runs"] and again["starts"] == result["starts"]


def test_blend_of_two_snapshots():
    from embodied.experiments.recipes import _blend

    prev = {"w": torch.tensor([0.0, 2.0]), "n": torch.tensor(3)}
    last = {"w": torch.tensor([1.0, 4.0]), "n": torch.tensor(5)}
    assert torch.equal(_blend(prev, last, 0.0)["w"], prev["w"]) and torch.equal(
        _blend(prev, last, 1.0)["w"], last["w"]
    )
    assert _blend(prev, last, 0.25)["w"].tolist() == [0.25, 2.5]
    assert int(_blend(prev, last, 0.25)["n"]) == 5  # integer buffers are not blended: the last step's


def test_papo_black_is_what_the_processor_makes_of_a_black_clip(tiny_policy):
    from embodied.policy.model import encode_prompts
    from embodied.rl.papo import black_value, masked_batch

    model, processor = tiny_policy
    ex = synthetic_examples(1)[0]
    black_clip = Clip(np.zeros_like(ex.clip.frames), 2.0)
    black = encode_prompts(processor, [ex.record], [black_clip], VideoConfig())["pixel_values_videos"]
    row = black_value(processor).repeat_interleave(black.shape[1] // 3)
    assert torch.allclose(black, row.expand_as(black), atol=1e-5)
    # masking every patch of a real clip gives exactly the black clip's pixels
    real = encode_prompts(processor, [ex.record], [ex.clip], VideoConfig())
    assert torch.allclose(masked_batch(real, processor, 1.0, True)["pixel_values_videos"], black, atol=1e-5)
    assert torch.equal(
        masked_batch(real, processor, 0.0, True)["pixel_values_videos"], real["pixel_values_videos"]
    )
