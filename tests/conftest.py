"""Shared fixtures: the tiny policy is built once per session into a throwaway cache."""

from __future__ import annotations

import os

import pytest


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
