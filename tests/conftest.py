"""Shared fixtures: the tiny policy (built into throwaway folders) and a few simulated drop clips."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _torch_threads():
    """Restore torch's intra-op thread count after every test: `embodied.run._setup` sets it process-wide
    (`threads=1`), and a later test comparing against a subprocess at the default count would sum in
    another order."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory):
    """`(model, processor)` of the built-in tiny Qwen2.5-VL, built (~3 s) under a session temp cache."""
    cache = tmp_path_factory.mktemp("embodied_cache")
    old = os.environ.get("EMBODIED_CACHE")
    os.environ["EMBODIED_CACHE"] = str(cache)
    try:
        from embodied.policy.model import load_policy
        from embodied.policy.tiny import build_tiny_policy

        path = build_tiny_policy()
        assert path.is_relative_to(cache), path  # the env var was honoured: nothing leaks into ~/.cache
        yield load_policy(path)
    finally:
        if old is None:
            os.environ.pop("EMBODIED_CACHE", None)
        else:
            os.environ["EMBODIED_CACHE"] = old


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """A folder holding the built-in tiny Qwen2.5-VL (seed 0), built once per test module."""
    from embodied.policy.tiny import TinySpec, build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", TinySpec(seed=0))


@pytest.fixture(scope="module")
def examples():
    """16 arrow-of-time questions on MuJoCo drop clips, 112 x 112, half of them reversed."""
    import numpy as np

    from embodied.data.load import Example
    from embodied.questions import arrow_of_time
    from embodied.video import Clip
    from embodied.worlds import DropWorld

    world = DropWorld(112, 112)
    spec = arrow_of_time.ClipSpec()
    out = []
    for i, rev in enumerate(arrow_of_time.balanced_directions(16, np.random.default_rng(0))):
        record, frames = arrow_of_time.make_example(world, 1000 + i, bool(rev), spec)
        out.append(Example({"id": f"t-{i}", "video": f"{i}.mp4", **record}, Clip(frames, spec.fps)))
    world.close()
    return out
