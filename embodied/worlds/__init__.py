"""MuJoCo worlds: scenes loaded from ``sim/``, randomised per episode, rendered headless.

Importing this package sets ``MUJOCO_GL=egl`` unless the user chose a backend, before mujoco's
GL bindings are touched (see :mod:`embodied.worlds.render`).
"""

from __future__ import annotations

import importlib.resources
import pathlib

from embodied.worlds.render import FrameRenderer, gl_context  # sets MUJOCO_GL first

__all__ = ["DropWorld", "FrameRenderer", "gl_context", "scene_path"]


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


def __getattr__(name: str) -> object:
    # Lazy so that `scene_path` works without importing the scene families.
    if name == "DropWorld":
        from embodied.worlds.drop import DropWorld

        return DropWorld
    raise AttributeError(name)
