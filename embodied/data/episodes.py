"""Interactive episodes as a source of the engine, in the MCQ dataset format (JSONL records + mp4 clips).

Layout under ``env.root``: ``manifest.json``, ``train.jsonl``, ``test.jsonl``, ``videos/<split>/<id>.mp4``.
``embodied.data.load.load_examples(root, split)`` loads them like any generated dataset; the records
carry no label (``answer`` is "") and ``meta`` holds what is needed to rebuild the world.
"""

from __future__ import annotations

from dataclasses import asdict

from embodied.data.engine import Made, Source, store, write_dataset
from embodied.data.load import manifest_matches
from embodied.data.schema import split_seeds
from embodied.envs import task
from embodied.envs.config import EnvConfig

SPLITS = ("train", "test")


class EpisodeSource(Source):
    """`env.n_train` and `env.n_test` episodes of every task in `env.tasks`."""

    name = "episodes"

    def __init__(self, cfg: EnvConfig) -> None:
        super().__init__(cfg, cfg.root, list(SPLITS), cfg.workers)

    def jobs(self) -> list[tuple[str, str, int, int]]:
        """`(split, task, index, seed)` per episode: every task and split draws seeds from its own stream."""
        jobs = []
        for split, n in (("train", self.cfg.n_train), ("test", self.cfg.n_test)):
            for name in self.cfg.tasks:
                task(name)  # fail early on an unknown task name
                seeds = split_seeds(self.cfg.seed, f"env-{name}-{split}", n)
                jobs += [(split, name, i, s) for i, s in enumerate(seeds)]
        return jobs

    def make(self, job: tuple[str, str, int, int]) -> list[Made]:
        split, name, index, seed = job
        c = self.cfg
        record, frames = task(name).make_episode(seed, c.difficulty, c.width, c.height, c.num_frames, c.fps)
        return [store(self.root, f"{split}-{name}-{index:05d}", split, record, frames, c.fps)]

    def versions(self, kinds: list[str]) -> dict[str, int]:
        return {t: task(t).VERSION for t in kinds}


def generate_episodes(cfg: EnvConfig, progress: bool = True) -> dict:
    """Write the train and test episodes of ``cfg`` under ``cfg.root``; returns the manifest."""
    return write_dataset(EpisodeSource(cfg), progress)


def ensure_episodes(cfg: EnvConfig, progress: bool = True) -> None:
    """Generate ``cfg``'s episodes unless ``cfg.root`` already holds them (``matches``)."""
    if not matches(cfg):
        generate_episodes(cfg, progress)


def matches(cfg: EnvConfig) -> bool:
    """Whether ``cfg.root`` already holds episodes generated with this config (so they can be reused)."""
    ignore = {"workers", "backend", "format_weight", "feedback", "answer"}  # `answer` applies on load
    return manifest_matches(cfg.root, asdict(cfg), ignore)
