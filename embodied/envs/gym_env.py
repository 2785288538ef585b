"""A Gymnasium-shaped view of an interactive task: one observation (the clip), one action, done.

Each episode is a contextual bandit step: ``reset(seed)`` shows the clip and the question, ``step(answer)``
executes the answer (the policy's text, or an already parsed action) and ends the episode with the
physics reward and its named terms in ``info``. Useful for code written against the Gymnasium API;
training uses the batched :func:`embodied.envs.reward.env_reward` instead.
"""

from __future__ import annotations

from typing import Any

from embodied.envs import execute, task
from embodied.envs.reward import env_reward


class TaskEnv:
    """``reset(seed) -> (obs, info)``, ``step(answer) -> (obs, reward, terminated, truncated, info)``."""

    def __init__(self, name: str, difficulty: str = "easy", backend: str = "cpu", **clip: Any) -> None:
        self.module, self.difficulty, self.backend, self.clip = task(name), difficulty, backend, clip
        self.record: dict | None = None

    def reset(self, seed: int) -> tuple[dict, dict]:
        """Obs: ``frames`` (T, H, W, 3) uint8 at ``fps``, ``question``, ``options``; info: the record."""
        self.record, frames = self.module.make_episode(seed, self.difficulty, **self.clip)
        obs = {"frames": frames, "fps": self.record["meta"]["fps"], "question": self.record["question"]}
        return obs | {"options": self.record["options"]}, {"record": self.record}

    def step(self, answer: Any) -> tuple[dict, float, bool, bool, dict]:
        """Execute ``answer`` (text with ``<answer>...</answer>``, or a parsed action); the episode ends."""
        if self.record is None:
            raise RuntimeError("call reset() before step()")
        if isinstance(answer, str):
            terms = env_reward([answer], [self.record], self.backend)[0]
        else:
            terms = execute(self.record, answer, self.backend)
        self.record, record = None, self.record
        return {}, terms["reward/total"], True, False, {"terms": terms, "record": record}
