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
required names are checked there, and again on import. A family kept elsewhere joins with `register`.
"""

from __future__ import annotations

import ast
import functools
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

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


def _top_level_names(tree: ast.Module) -> tuple[set[str], dict[str, object]]:
    """Every name a module's top level binds, and the constants it assigns."""
    names: set[str] = set()
    consts: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in (t for t in targets if isinstance(t, ast.Name)):
                names.add(t.id)
                if isinstance(node.value, ast.Constant):
                    consts[t.id] = node.value.value
    return names, consts


def declares_family(path: Path) -> tuple[int, str] | None:
    """``(RANK, NAME)`` when the module at ``path`` assigns ``NAME`` (a string) and defines ``verify``;
    None for any other module (helpers such as `caption.py`). Read from the source, nothing imported; a
    family that lacks a `PROTOCOL` name or ``RANK`` is an error naming the file and what it lacks."""
    names, consts = _top_level_names(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    if not isinstance(consts.get("NAME"), str) or "verify" not in names:
        return None
    if consts["NAME"] != path.stem:
        raise ImportError(f"{path}: NAME = {consts['NAME']!r}, but a family's module is named after it")
    missing = [k for k in PROTOCOL if k not in names]
    if missing:
        raise ImportError(f"{path}: a question family module must define {missing} (questions.PROTOCOL)")
    if not isinstance(consts.get("RANK"), int):
        raise ImportError(f"{path}: a shipped question family needs RANK = <int> (its place in FAMILIES)")
    return consts["RANK"], path.stem


def discover(folder: Path) -> tuple[str, ...]:
    """The names of the family modules in ``folder``, by ``RANK``."""
    found = [d for p in sorted(folder.glob("*.py")) if (d := declares_family(p))]
    ranks = [rank for rank, _ in found]
    if len(set(ranks)) != len(ranks):
        raise ImportError(f"{folder}: two question families share a RANK: {sorted(found)}")
    return tuple(name for _, name in sorted(found))


def check(module: ModuleType) -> ModuleType:
    """``module`` if it follows `PROTOCOL`; a TypeError naming it and what it lacks otherwise."""
    missing = [k for k in PROTOCOL if not hasattr(module, k)]
    if missing:
        raise TypeError(
            f"{module.__name__} is not a question family: it lacks {missing} (embodied.questions)"
        )
    if not isinstance(module.NAME, str) or not module.NAME:
        raise TypeError(f"{module.__name__}: NAME must be a non-empty string, got {module.NAME!r}")
    return module


FAMILIES = discover(Path(__file__).parent)
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


_REGISTERED: dict[str, ModuleType] = {}
"""Families added by `register`, in registration order."""


def family_names() -> tuple[str, ...]:
    """Every known question family: the shipped ones, then the registered ones in registration order."""
    return FAMILIES + tuple(_REGISTERED)


def is_family(name: object) -> bool:
    """Whether ``name`` is a known question family (shipped or registered)."""
    return name in FAMILIES or name in _REGISTERED


def register(module: ModuleType) -> ModuleType:
    """Make the question family ``module`` (defined anywhere) known by its ``NAME``: generation (simulated
    and from footage), SFT targets, rewards and evaluation then work on it as on a shipped family.
    Registration lives in this process; spawned data workers register it again from its file
    (`registered_files`, `ensure_registered`)."""
    check(module)
    name = module.NAME
    if name in FAMILIES or (name in _REGISTERED and _REGISTERED[name] is not module):
        raise ValueError(f"a question family named {name!r} is already known")
    _REGISTERED[name] = module
    return module


def unregister(name: str) -> None:
    """Forget a family added by `register` (shipped families stay)."""
    _REGISTERED.pop(name, None)


def family(name: str) -> ModuleType:
    """The module of question family ``name`` (a shipped one imported and checked on first use)."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in FAMILIES:
        raise KeyError(f"unknown question family {name!r}; known: {list(family_names())}")
    return _shipped(name)


@functools.cache
def _shipped(name: str) -> ModuleType:
    return check(importlib.import_module(f"embodied.questions.{name}"))


def registered_files() -> dict[str, str]:
    """``{NAME: source file}`` of the registered families that live in a file, for processes that must
    register them again (a spawned worker starts with only the shipped families)."""
    return {n: m.__file__ for n, m in _REGISTERED.items() if getattr(m, "__file__", None)}


def ensure_registered(files: dict[str, str]) -> None:
    """Register, from their source files, the families of ``files`` (`registered_files`) this process does
    not know yet."""
    import importlib.util

    for name, path in files.items():
        if is_family(name):
            continue
        spec = importlib.util.spec_from_file_location(f"embodied_family_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        register(module)
