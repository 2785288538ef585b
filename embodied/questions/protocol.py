"""What a question family module is, how the shipped ones are found, and how an outside one joins.

A family is one module, and that module declares everything the rest of the code needs, so that no code
outside it branches on its name (`PROTOCOL` is required, `HOOKS` optional with a default each):

* ``NAME`` (the module's own name for a shipped family), ``VERSION`` (bumped whenever what it generates for
  a seed changes) and, for a shipped family, ``RANK`` (its place in `FAMILIES`; rank 0 is the default family,
  the quickstart's);
* the generator: ``num_options(tier, variant)`` and ``make(world, rng, answer, tier, fam, clip) -> (record,
  frames)``; the verifier ``verify(record, ...)``; the SFT ``<think>`` texts ``reasoning_for(record)`` and
  ``trace_for(record)``;
* optional (see `HOOKS`): ``VARIANTS`` (question variants, the default first), ``from_frames(frames, fps,
  rng, answer, tier, fam)`` to make questions from footage, ``NEEDS_MOTION`` (footage windows that barely
  move are refused), ``footage_frames(tier, fam, clip)`` (frames of footage one question takes),
  ``options_are_orders(record)`` (the options are orders of pieces: partial credit, answers spelled as
  orders), ``phrases()`` (fixed text for a tokenizer), and ``quickstart_answers(n, rng)`` /
  ``quickstart_example(world, seed, answer, clip)`` (the dataset of ``data.families: []``, which the default
  family makes).

A module of `embodied/questions/` that assigns ``NAME`` (a string) and defines ``verify`` is a family: it is
found by reading the package's sources without importing them (so the config loads in milliseconds), its
required names are checked there, and again on import (`embodied.registry`). A family kept elsewhere
joins with `register`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from embodied.registry import Declared, Registry

PROTOCOL = ("NAME", "VERSION", "num_options", "make", "verify", "reasoning_for", "trace_for")
"""What every question family module must define (see the module docstring)."""


def _one_frame(tier: str, fam, clip) -> int:
    """A question that needs no motion takes one frame of footage (a still picture)."""
    return 1


def _no_orders(record: dict) -> bool:
    return False


def _no_phrases() -> tuple[str, ...]:
    return ()


def _balanced_quickstart(module: ModuleType, n: int, rng):
    """Answer indices for the quickstart: each of the family's easy-tier options `n // k` or `n // k + 1`
    times, in random order."""
    import numpy as np

    return rng.permutation(np.arange(n) % module.num_options("easy", ""))


def _easy_quickstart(module: ModuleType, world, seed: int, answer: int, clip):
    """One easy question of the family's default variant (in the world of the default scene), its seed in
    `meta`."""
    import numpy as np

    fam = FamilySpec(family=module.NAME)
    record, frames = module.make(world, np.random.default_rng(seed), answer, "easy", fam, clip)
    record["meta"] = {"seed": int(seed), "difficulty": "easy", **record["meta"]}
    return record, frames


HOOKS = {
    "VARIANTS": ("",),
    "from_frames": None,
    "NEEDS_MOTION": False,
    "footage_frames": _one_frame,
    "options_are_orders": _no_orders,
    "phrases": _no_phrases,
    "quickstart_answers": _balanced_quickstart,
    "quickstart_example": _easy_quickstart,
}
"""Optional names of a family module and what stands in for each one the module leaves out (`hook`): one
unnamed variant (`VARIANTS`: the question variants, the default first, which `data.families[].variant` ""
means), `from_frames` None (not made from footage), `NEEDS_MOTION` False, one frame of footage, options
that are not orders, no phrases, and a quickstart of balanced easy questions from `make`."""
_BOUND = ("quickstart_answers", "quickstart_example")
"""Defaults that need the module itself (they call its `num_options` and `make`)."""


def hook(module: ModuleType, name: str):
    """The module's `name` (one of `HOOKS`), or the protocol's default for it."""
    if hasattr(module, name):
        return getattr(module, name)
    default = HOOKS[name]
    return functools.partial(default, module) if name in _BOUND else default


def _declares_family(module: Declared) -> bool:
    """A module that assigns ``NAME`` (a string) and defines ``verify`` is a family; helpers such as
    `caption.py` are not."""
    return isinstance(module.constants.get("NAME"), str) and "verify" in module.names


REGISTRY = Registry("question family", "embodied.questions", _declares_family, required=PROTOCOL, ranked=True)
"""The question families: the shipped modules of this package (found by reading their sources: a family
lacking a `PROTOCOL` name or ``RANK`` is an error naming its file), then the registered ones."""


def discover(folder: Path) -> tuple[str, ...]:
    """The names of the family modules in ``folder``, by ``RANK``."""
    return REGISTRY.scan(folder)


FAMILIES = REGISTRY.shipped()
"""The question families shipped in this package, by ``RANK`` (the first is the default family)."""


@dataclass
class FamilySpec:
    """One question family in a generation spec (`data.families` in YAML)."""

    family: str = FAMILIES[0]
    """A question family's `NAME` (`embodied.questions.family_names()`); the default is the family of `RANK` 0
    (arrow_of_time)."""
    scene: str = "drop"
    """World it is simulated in (`embodied.worlds` registry); ignored with `data.from_videos`."""
    weight: float = 1.0
    """Share of each split's record count (`n_train`, ...) relative to the other families."""
    tiers: list[str] = field(default_factory=lambda: ["easy"])
    """Difficulty tiers; a family's records are split evenly over them, answers balanced per tier."""
    variant: str = ""
    """Family-specific question variant (spatial_puzzle: arrangement | patch); empty = the default."""
    num_frames: int = 0
    """Frames per clip, for the families that read it (arrow_of_time; 0 = `data.clip.num_frames`)."""


@dataclass
class ClipSpec:
    """What a dataset's clips look like (`data.clip`), handed to every family's `make`."""

    fps: float = 2.0
    """Rate (frames per second of simulated time) at which the clip is rendered and stored (`data.clip.fps`);
    the policy samples stored clips at `video.fps`."""
    num_frames: int = 4
    max_start: float = 0.25
    """Latest clip start after release (s). Later starts give nearly static clips with no answer."""


def family_names() -> tuple[str, ...]:
    """Every known question family: the shipped ones, then the registered ones in registration order."""
    return REGISTRY.names()


def is_family(name: object) -> bool:
    """Whether ``name`` is a known question family (shipped or registered)."""
    return name in REGISTRY


def register(module: ModuleType) -> ModuleType:
    """Make the question family ``module`` (defined anywhere) known by its ``NAME``: generation (simulated
    and from footage), SFT targets, rewards and evaluation then work on it as on a shipped family, here and
    in the worker processes this one spawns (`embodied.registry.restore`)."""
    return REGISTRY.register(module)


def unregister(name: str) -> None:
    """Forget a family added by `register` (shipped families stay)."""
    REGISTRY.unregister(name)


def family(name: str) -> ModuleType:
    """The module of question family ``name`` (a shipped one imported and checked on first use)."""
    return REGISTRY.get(name)
