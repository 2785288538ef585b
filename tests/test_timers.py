"""The profiler's timers: nested keys, and calls made in a thread pool keyed under the caller's path."""

from __future__ import annotations

import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor

from embodied.bench.timers import Timers


def _module():
    mod = types.ModuleType("timed_fixture")

    def leaf(x):
        time.sleep(0.005)  # the pool's calls overlap
        return x + 1

    def outer(n, threads):
        with ThreadPoolExecutor(threads) as pool:
            return sum(pool.map(mod.leaf, range(n)))

    def nested():
        return mod.leaf(1)

    mod.leaf, mod.outer, mod.nested = leaf, outer, nested
    sys.modules[mod.__name__] = mod
    return mod


def test_pool_calls_are_keyed_under_the_calling_path_and_summed():
    mod = _module()
    timers = Timers()
    timers.wrap(mod, "leaf", "decode")
    timers.wrap(mod, "outer", "load")
    timers.wrap(mod, "nested", "eval")
    try:
        assert mod.outer(40, 4) == sum(range(1, 41))
        assert mod.nested() == 2
        assert mod.leaf(0) == 1
    finally:
        timers.restore()
    calls = {row["path"]: row["calls"] for row in timers.table()}
    # before: one stack shared by the threads gave keys such as load>decode>decode
    assert calls == {"load": 1, "load>decode": 40, "eval": 1, "eval>decode": 1, "decode": 1}
    assert mod.leaf(0) == 1 and not hasattr(mod.leaf, "__wrapped__")  # restored


def test_every_named_target_exists():
    """Each call the profiler and the benches time or tap names a function that exists where it is looked up
    (a renamed one would fail only when a profile runs)."""
    import importlib

    from embodied.bench import prefix, step, timers

    named = [t[:2] for t in timers.TARGETS + timers.GENERATION_TARGETS + prefix.TIMED]
    named += [t[:2] for t in step.SFT_TAPS + step.GRPO_TAPS + step.GRPO_TIMERS]
    missing = []
    for module, path in named:
        owner = importlib.import_module(module)
        for part in path.split("."):
            owner = getattr(owner, part, None)
        if owner is None:
            missing.append(f"{module}:{path}")
    assert not missing, missing
