"""MuJoCo worlds: scenes loaded from ``sim/``, randomised per episode, rendered headless.

Importing this package sets ``MUJOCO_GL=egl`` unless the user chose a backend, before mujoco's
GL bindings are touched (see :mod:`embodied.worlds.render`).
"""

from __future__ import annotations

import importlib
import importlib.resources
import pathlib
from typing import Any

from embodied.worlds.render import FrameRenderer, gl_context  # sets MUJOCO_GL first

__all__ = [
    "WORLDS",
    "WORLD_NAMES",
    "DropWorld",
    "FrameRenderer",
    "gl_context",
    "make_world",
    "scene_path",
    "world_class",
]

# scene name -> (module, class); imported lazily so that one scene's import cost is paid only when used.
_SCENES = {
    "drop": ("embodied.worlds.drop", "DropWorld"),
    "occluder": ("embodied.worlds.occluder", "OccluderWorld"),
    "slide": ("embodied.worlds.slide", "SlideWorld"),
    "topple": ("embodied.worlds.topple", "ToppleWorld"),
    "dominoes": ("embodied.worlds.dominoes", "DominoesWorld"),
    "pendulum": ("embodied.worlds.pendulum", "PendulumWorld"),
}
WORLD_NAMES = tuple(_SCENES)
"""Every registered scene's name (a world is one simulated instance of a scene)."""


def scene_path(name: str) -> pathlib.Path:
    """Locate ``sim/<name>/scene.xml`` for both installed and source-tree layouts.

    An installed wheel ships scenes inside the package as ``embodied/_sim`` (nothing but
    ``embodied`` may go into site-packages); a source checkout keeps them in the top-level
    ``sim/`` folder so they stay editable without touching code.
    """
    places: list[pathlib.Path] = []
    try:
        packaged = importlib.resources.files("embodied") / "_sim" / name / "scene.xml"
        places.append(pathlib.Path(str(packaged)))
    except (ModuleNotFoundError, TypeError, ValueError):
        pass
    places.append(pathlib.Path(__file__).resolve().parents[2] / "sim" / name / "scene.xml")
    for path in places:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"scene {name!r} not found; looked in the installed package (embodied/_sim/{name}/"
        f"scene.xml) and the repository's sim/ folder: " + ", ".join(map(str, places))
    )


def world_class(name: str) -> type:
    """The world class registered as ``name`` (see ``WORLDS``), importing only its module."""
    if name not in _SCENES:
        raise ValueError(f"unknown scene {name!r}; known scenes: {', '.join(sorted(_SCENES))}")
    module, cls = _SCENES[name]
    return getattr(importlib.import_module(module), cls)


def make_world(name: str, width: int = 128, height: int = 128, **kwargs: Any) -> Any:
    """Build a world of scene ``name`` rendering ``width`` x ``height`` frames; ``kwargs`` go to its
    constructor (e.g. ``difficulty="hard"`` for every scene but drop, ``max_objects`` for drop)."""
    return world_class(name)(width=width, height=height, **kwargs)


def __getattr__(name: str) -> object:
    # Lazy so that `scene_path` works without importing the scenes' modules.
    if name == "WORLDS":
        return {n: world_class(n) for n in _SCENES}
    for module, cls in _SCENES.values():
        if name == cls:
            return getattr(importlib.import_module(module), cls)
    raise AttributeError(name)
