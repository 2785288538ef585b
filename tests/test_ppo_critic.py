"""PPO's critic on the real tiny Qwen2.5-VL (tests/conftest.py): it fits a return it can learn, and fails to
when its loss is zeroed; the value head's own layer and detached input; the warm-up that trains the head
alone; the critic's metrics at every step, the warning when it is worse than a constant, and the warning
that clip settings cannot act with one update per rollout."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from grpo_configs import grpo_config, grpo_step

from embodied.config import GRPOConfig
from embodied.policy.model import load_policy
from embodied.rl.critic import CriticWatch
from embodied.rl.ppo import ValueHead
from embodied.rl.rollout import sample_groups
from embodied.train.config import PPOConfig
from embodied.train.grpo import inert_settings, sampling_args, train_grpo
from embodied.train.metrics import read_metrics
from embodied.train.state import Run
from embodied.video import VideoConfig

RECIPES = Path(__file__).parents[1] / "configs/recipes"
PPO = yaml.safe_load((RECIPES / "ppo.yaml").read_text())["grpo"]


def _split(kw: dict) -> list[dict]:
    """Keyword changes as config layers: `grpo.ppo.*` names (`value_warmup_steps`) go to the `ppo` section."""
    ppo_keys = {f.name for f in dataclasses.fields(PPOConfig)}
    return [
        {k: v for k, v in kw.items() if k not in ppo_keys},
        {"ppo": {k: v for k, v in kw.items() if k in ppo_keys}},
    ]


def _ppo(**kw) -> GRPOConfig:
    """The PPO preset at test size: 4 prompts x 2 answers of at most 8 tokens."""
    base = dict(steps=2, prompts_per_step=4, group_size=2, max_new_tokens=8, log_every=1, checkpoint_every=0)
    return grpo_config(PPO, base, *_split(kw))


def varied_reward(texts, records):
    """A reward with spread even for an untrained policy (its answers are unparseable): the text's length."""
    return [{"reward/total": float(len(t) % 3), "reward/accuracy": float(len(t) % 2)} for t in texts]


# --- the critic learns a return it can learn -------------------------------------------------------------


@pytest.mark.parametrize("vf_coef", [None, 0.0], ids=["preset", "value-loss-zeroed"])
def test_value_head_fits_a_learnable_return(tiny_path, examples, vf_coef):
    """A fixed return that depends on the question alone (1 for clips 0 and 2, 0 for clips 1 and 3, on every
    token: lambda = 1, no KL) is learnable from the policy's hidden states, which differ with the clip.
    With the preset's critic settings the head must explain > 0.9 of its variance within 12 steps on the
    same rollout; with the value loss zeroed the head never moves and explains nothing (the check fails)."""
    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    kw = {"lam": 1.0, "kl_coef": 0.0, "kl_in_reward": False, "value_warmup_steps": 0}
    cfg = _ppo(**kw, **({} if vf_coef is None else {"vf_coef": vf_coef}))
    ro = sample_groups(model, processor, examples[:4], VideoConfig(), varied_reward, sampling_args(cfg))
    ro.rewards = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    t = grpo_step(model, processor, cfg)
    head = t.estimator.value_head
    evs = []
    for step in range(1, 13):  # the preset's head passes 0.9 at step 8 (0.903), the zeroed one never moves
        m = t.learn(ro, step)
        evs.append(m["critic/explained_variance"])  # the values before this step's updates
        if evs[-1] > 0.9:
            break
    if vf_coef == 0.0:
        assert max(evs) == 0.0 and torch.equal(head.linear.weight, torch.zeros_like(head.linear.weight))
    else:
        assert evs[-1] > 0.9, [round(e, 3) for e in evs]


# --- the value head --------------------------------------------------------------------------------------


def test_value_head_with_a_layer_of_its_own():
    torch.manual_seed(0)
    head = ValueHead(8, hidden_units=5)
    hidden = torch.randn(2, 3, 8, requires_grad=True)
    v = head(hidden)
    assert v.shape == (2, 3) and torch.equal(v, torch.zeros(2, 3))  # zero output layer: values start at 0
    assert head.body[0].weight.shape == (5, 8) and head.linear.weight.shape == (1, 5)
    assert head.body[0].weight.abs().sum() > 0  # the hidden layer is random: its features differ
    (head(hidden) - 1.0).pow(2).mean().backward()
    assert head.linear.weight.grad.abs().sum() > 0 and head.body[0].weight.grad.abs().sum() == 0
    # v = w . tanh(W h + b) + c with w = 1 on unit 0 only, W = 0, b_0 = 0.5, c = 0.25:
    # v = tanh(0.5) + 0.25 = 0.462117 + 0.25, whatever h
    with torch.no_grad():
        head.body[0].weight.zero_()
        head.body[0].bias.copy_(torch.tensor([0.5, 0.0, 0.0, 0.0, 0.0]))
        head.linear.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0]]))
        head.linear.bias.fill_(0.25)
    assert torch.allclose(head(hidden), torch.full((2, 3), 0.462117 + 0.25), atol=1e-6)
    with pytest.raises(ValueError):
        ValueHead(8, hidden_units=-1)


def test_detached_value_head_sends_no_gradient_to_the_backbone():
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    for detach, reaches in ((False, True), (True, False)):
        hidden.grad = None
        head = ValueHead(8, init_std=0.1, hidden_units=4, detach=detach)
        (head(hidden) - 1.0).pow(2).mean().backward()
        assert (hidden.grad is not None and hidden.grad.abs().sum() > 0) == reaches
        assert head.linear.weight.grad.abs().sum() > 0  # the head itself learns either way


# --- the warm-up: the head learns, the policy waits --------------------------------------------------------


def test_warmup_steps_train_the_head_alone(tiny_path, examples):
    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    cfg = _ppo(value_warmup_steps=1, value_detach=False, updates_per_rollout=2)
    ro = sample_groups(model, processor, examples[:4], VideoConfig(), varied_reward, sampling_args(cfg))
    t = grpo_step(model, processor, cfg)
    head = t.estimator.value_head
    policy = [p.detach().clone() for p in model.parameters()]
    m = t.learn(ro, 1)
    assert m["critic/warmup"] == 1.0 and "loss/policy" not in m and m["loss/value"] > 0
    assert all(torch.equal(a, b) for a, b in zip(policy, model.parameters()))  # not one weight moved
    assert head.linear.weight.abs().sum() > 0  # the head did
    m = t.learn(ro, 2)
    assert m["critic/warmup"] == 0.0 and "loss/policy" in m
    assert any(not torch.equal(a, b) for a, b in zip(policy, model.parameters()))


# --- what the critic logs and when it warns -------------------------------------------------------------


def test_critic_watch_warns_after_patience_steps_below_zero():
    watch = CriticWatch(patience=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning before the third step in a row fails here
        assert [watch.see(s, ev) for s, ev in enumerate([-0.5, -0.1, 0.2, -0.3, -0.2], 1)] == [False] * 5
    with pytest.warns(UserWarning, match="below 0 for 3 steps"):
        assert watch.see(6, -0.01)  # steps 4, 5, 6: three in a row
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not watch.see(7, -0.4)  # once per stretch
        assert not watch.see(8, -0.0004) and not watch.see(9, -1.0)  # a constant critic: a new stretch
        assert not any(CriticWatch(0).see(s, -1.0) for s in range(20))  # patience 0: never


def _preset(name: str, **kw) -> GRPOConfig:
    return grpo_config(yaml.safe_load((RECIPES / f"{name}.yaml").read_text())["grpo"], *_split(kw))


def test_clip_settings_that_cannot_act_with_one_update_per_rollout():
    assert inert_settings(GRPOConfig()) == []  # plain GRPO: the default clip is not a choice
    assert inert_settings(_preset("dapo")) == ["grpo.clip_eps_high=0.28"]
    gspo = inert_settings(_preset("gspo"))
    assert "grpo.ratio_level=sequence" in gspo and any(s.startswith("grpo.clip_eps=") for s in gspo)
    assert inert_settings(_preset("ppo", updates_per_rollout=1)) == ["grpo.ppo.value_clip=0.2"]
    assert inert_settings(_preset("ppo", updates_per_rollout=1, value_clip=0.0)) == []
    assert inert_settings(_preset("ppo")) == []  # 4 updates per rollout: the clips can act
    assert inert_settings(_preset("dapo", updates_per_rollout=2)) == []
    # one update per rollout: no later update for target_kl to stop
    assert inert_settings(_preset("grpo", target_kl=0.02)) == ["grpo.target_kl=0.02"]


# one update: no stop


def test_ppo_run_logs_the_critic_every_step_and_warns_once_at_start(tiny_path, examples, tmp_path):
    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    cfg = _ppo(steps=3, log_every=2, updates_per_rollout=1, value_warmup_steps=1, value_ev_patience=0)
    with pytest.warns(UserWarning, match="these settings never act") as caught:
        train_grpo(
            cfg, Run(model, processor, examples[:8], tmp_path, progress=False, reward_fn=varied_reward)
        )
    assert sum("these settings never act" in str(w.message) for w in caught) == 1
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "grpo"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:  # the critic at every step, the rest only at log steps (2) and the last (3)
        for key in ("critic/explained_variance", "critic/explained_variance_fit", "loss/value"):
            assert key in r, (r["step"], key)
        assert ("reward/total" in r) == (r["step"] != 1)
    assert [r["critic/warmup"] for r in rows] == [1.0, 0.0, 0.0]
    assert dataclasses.asdict(cfg)["ppo"]["value_ev_patience"] == 0


def test_recipes_report_the_critic_at_the_end_of_each_run():
    from embodied.experiments.recipes_report import critic_curves, critic_end, recipes_table

    logged = [
        {
            "step": s,
            "critic/explained_variance": ev,
            "critic/explained_variance_fit": ev + 0.1,
            "critic/explainable_variance": 0.05,
        }
        for s, ev in enumerate([-0.2, 0.1, -0.3, 0.4, 0.6, 0.8], 1)
    ]
    logged.append({"step": 6, "eval/accuracy": 0.9})  # a validation row holds no critic metric
    curves = critic_curves(logged)
    assert curves["explained_variance"][-1] == (6, 0.8) and len(curves["explained_variance"]) == 6
    assert curves["value_loss"] == []
    end = critic_end(curves, last=3)
    # last step 0.8; mean of the last 3: (0.4 + 0.6 + 0.8) / 3 = 0.6; 2 steps below 0; fit 0.6 + 0.1
    assert end == {
        "ev_last": 0.8,
        "ev_last10": 0.6,
        "ev_below0_steps": 2,
        "ev_fit_last10": 0.7,
        "ev_ceiling_last10": 0.05,
    }
    none = critic_end(critic_curves([{"step": 1, "reward/total": 1.0}]))
    assert set(none.values()) == {None}
    run = {
        "arm": "ppo",
        "seed": 0,
        "test_accuracy": 0.9,
        "test_ci95": [0.8, 0.95],
        "test_unparseable": 0.0,
        "steps_to_target": 5,
        **end,
    }
    result = {
        "steps": 6,
        "target": 0.9,
        "policy": "p",
        "n_val": 1,
        "n_test": 1,
        "wall_s": 1.0,
        "workers": 1,
        "threads": 1,
        "starts": [],
        "summary": [],
        "runs": [run],
    }
    assert "| ppo | 0 | 0.800 | 0.600 | 2 / 6 | 0.700 |" in recipes_table(result)


def test_explainable_variance_is_the_share_between_prompts():
    """A perfect prompt-only critic explains the variance between prompts and none within them."""
    from embodied.rl.ppo import prompt_explainable_variance

    # answers depend on the prompt alone: all of the variance is explainable
    assert float(prompt_explainable_variance(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))) == 1.0
    # every prompt is the same coin: a large sample's share between prompts is about 0
    torch.manual_seed(0)
    coin = (torch.rand(2000, 4) < 0.5).float()
    assert abs(float(prompt_explainable_variance(coin))) < 0.03
    # prompts of success rate 0.1 and 0.9 in equal numbers: Var(p) / (p(1-p)) = 0.16 / 0.25 = 0.64
    p = torch.tensor([0.1, 0.9]).repeat(2000).unsqueeze(1)
    mixed = (torch.rand(4000, 8) < p).float()
    assert abs(float(prompt_explainable_variance(mixed)) - 0.64) < 0.03
    assert float(prompt_explainable_variance(torch.ones(3, 2))) == 0.0  # no variance, nothing to explain
    with pytest.raises(ValueError, match="G >= 2"):
        prompt_explainable_variance(torch.ones(3, 1))
