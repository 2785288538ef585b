"""Test helper: GRPO configs built as a config file builds them (nested sections merged key by key)."""

from __future__ import annotations


def grpo_config(*layers: dict, **changes):
    """A `GRPOConfig` from YAML-like layers merged in order, nested sections merged key by key (`ppo`,
    `papo`, `cov`, `overlong`), as a config file and overrides are: `grpo_config(preset, {"ppo":
    {"value_warmup_steps": 1}}, steps=2)`."""
    from omegaconf import OmegaConf

    from embodied.train.config import GRPOConfig

    merged = OmegaConf.merge(OmegaConf.structured(GRPOConfig), *layers, changes)
    return OmegaConf.to_object(merged)


def grpo_step(model, processor, cfg, estimator=None):
    """A GRPO step (`embodied.train.grpo.GRPO`) for calling `update` and `learn` directly: one process, no
    reference policy, no data; `estimator` replaces the one `cfg.advantage` names."""
    from embodied.rl.advantages import ESTIMATORS
    from embodied.rl.rewards import mcq_rewards
    from embodied.train.distributed import Processes
    from embodied.train.grpo import GRPO, make_optimizer, sampling_args
    from embodied.train.state import Run

    estimator = estimator or ESTIMATORS[cfg.advantage](cfg, model)
    optimizer = make_optimizer(model, estimator, cfg)
    run = Run(model, processor, (), "unused")
    procs = Processes()
    return GRPO(
        cfg,
        run,
        procs,
        model,
        None,
        estimator,
        optimizer,
        mcq_rewards(),
        sampling_args(cfg),
        False,
        iter(()),
        None,
    )


def critic_with(cfg, model, head):
    """PPO's critic estimator (`grpo.advantage=gae`) on a given value head."""
    from embodied.rl.critic import Critic

    critic = Critic(cfg, model)
    critic.value_head, critic.modules = head, {"value_head": head}
    return critic
