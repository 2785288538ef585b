"""Headless OpenGL for MuJoCo: choose a backend once, keep one context, swap models cheaply.

Why this module exists: creating a GL context costs ~1 s the first time in a process and a
``mujoco.Renderer`` per clip costs ~150 ms, while a dataset generator renders thousands of short
clips whose MuJoCo model changes every episode. So the process opens ONE offscreen GL context
(:func:`gl_context`) and a :class:`FrameRenderer` rebinds only the model-dependent objects
(``MjvScene`` <1 ms, and ``MjrContext`` ~3-4 ms only when what it uploads changed) when the model
changes.

Backend choice: ``MUJOCO_GL`` defaults to ``egl`` (set before mujoco's GL is first touched). If the
user did not choose a backend and EGL cannot create a context, we fall back to ``osmesa``. If
neither works the error names the Debian packages to install.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import sys
from typing import Any

import numpy as np

# Must happen before anything imports mujoco's GL bindings; setdefault keeps a user's choice.
# An empty MUJOCO_GL counts as unset (mujoco itself treats it as "pick a default").
_USER_CHOSE_GL = bool(os.environ.get("MUJOCO_GL", "").strip())
if not _USER_CHOSE_GL:
    os.environ["MUJOCO_GL"] = "egl"


_INSTALL_HINT = (
    "MuJoCo offscreen rendering needs EGL or OSMesa. On Debian/Ubuntu install either "
    "`apt-get install -y libegl1 libegl-mesa0 libgl1-mesa-dri` (MUJOCO_GL=egl) or "
    "`apt-get install -y libosmesa6` (MUJOCO_GL=osmesa)."
)


def _import_mujoco() -> Any:
    """Import mujoco, whose ``__init__`` already binds the GL backend named by MUJOCO_GL.

    If the default (egl) cannot even load, retry with osmesa; otherwise fail with the install hint
    instead of a PyOpenGL AttributeError deep in an import.
    """
    try:
        return importlib.import_module("mujoco")
    except (ImportError, AttributeError, OSError) as exc:
        first = f"MUJOCO_GL={os.environ['MUJOCO_GL']}: {type(exc).__name__}: {exc}"
        if _USER_CHOSE_GL:
            raise RuntimeError(f"importing mujoco failed ({first}). {_INSTALL_HINT}") from exc
    for name in [m for m in sys.modules if m == "mujoco" or m.startswith("mujoco.")]:
        del sys.modules[name]
    _forget_pyopengl()
    os.environ.pop("PYOPENGL_PLATFORM", None)
    os.environ["MUJOCO_GL"] = "osmesa"
    try:
        return importlib.import_module("mujoco")
    except (ImportError, AttributeError, OSError) as exc:
        msg = f"importing mujoco failed ({first}; osmesa: {exc}). {_INSTALL_HINT}"
        raise RuntimeError(msg) from exc


_CONTEXT: Any = None
_BACKEND: str | None = None


def _forget_pyopengl() -> None:
    """Drop PyOpenGL from sys.modules so it re-reads PYOPENGL_PLATFORM on the next import.

    PyOpenGL binds its platform (EGL, OSMesa, GLX) once at import; a failed EGL attempt would
    otherwise pin it to EGL and make the OSMesa fallback impossible in the same process.
    """
    for name in list(sys.modules):
        if (
            name == "OpenGL"
            or name.startswith("OpenGL.")
            or name.startswith("mujoco.egl")
            or name.startswith("mujoco.osmesa")
        ):
            del sys.modules[name]


mujoco = _import_mujoco()  # before anything below touches GL


def _try_backend(backend: str, width: int, height: int) -> Any:
    """Create and make current a GL context of ``backend`` (``egl`` or ``osmesa``)."""
    if backend not in ("egl", "osmesa"):
        raise RuntimeError(f"MUJOCO_GL={backend!r} is not a headless backend; use egl or osmesa")
    current = os.environ.get("PYOPENGL_PLATFORM")
    if current and current.lower() != backend:
        _forget_pyopengl()
        del os.environ["PYOPENGL_PLATFORM"]
    module = importlib.import_module(f"mujoco.{backend}")
    ctx = module.GLContext(width, height)
    ctx.make_current()
    return ctx


def _load_triton_first() -> None:
    """Import triton (if installed) before Mesa's EGL driver is loaded.

    Measured here: once a Mesa EGL context exists, importing triton (which transformers and torch
    pull in lazily) segfaults inside its native LLVM. Loaded the other way round, both work.
    """
    with contextlib.suppress(Exception):  # triton is optional: nothing to pre-load then
        importlib.import_module("triton")


def gl_context(width: int = 640, height: int = 480) -> tuple[Any, str]:
    """Return the process-wide offscreen GL context and its backend name, creating it once.

    The context's own framebuffer size does not limit rendering: MuJoCo renders into its
    offscreen buffer sized by the model (``visual/global/offwidth``), which is set per model.
    """
    global _CONTEXT, _BACKEND
    if _CONTEXT is not None:
        _CONTEXT.make_current()
        return _CONTEXT, str(_BACKEND)
    _load_triton_first()
    first = os.environ["MUJOCO_GL"].lower()
    candidates = [first]
    if first == "egl" and not _USER_CHOSE_GL:
        candidates.append("osmesa")
    errors = []
    for backend in candidates:
        try:
            _CONTEXT = _try_backend(backend, width, height)
        except Exception as exc:  # noqa: BLE001 - any failure means "try the next backend"
            errors.append(f"{backend}: {type(exc).__name__}: {exc}")
            continue
        _BACKEND = backend
        os.environ["MUJOCO_GL"] = backend
        return _CONTEXT, backend
    raise RuntimeError(
        "could not create an offscreen GL context (" + "; ".join(errors) + "). " + _INSTALL_HINT
    )


def context_key(model: mujoco.MjModel) -> bytes | None:
    """Digest of everything ``mjr_makeContext`` uploads from ``model``, or None if it is not covered.

    Two models with the same key can share one ``MjrContext``: the same textures, materials' texture
    bindings, plane grids, built-in shape resolution, offscreen and shadow buffer sizes. A world that
    adds primitive objects to a fixed scene per episode (every clip of the data engine) therefore keeps
    its context. The only inputs left out are the scalars scaled by ``stat.extent`` (shadow clip, fog
    range), which :meth:`FrameRenderer.set_model` rewrites; fog itself is off in our scenes. Models with
    meshes, height fields, skins or flexes always get a fresh context (None).
    """
    if model.nmesh or model.nhfield or model.nskin or model.nflex:
        return None
    planes = model.geom_type == mujoco.mjtGeom.mjGEOM_PLANE
    vis = model.vis
    scalars = [
        vis.global_.offwidth,
        vis.global_.offheight,
        vis.global_.linewidth,
        vis.quality.shadowsize,
        vis.quality.offsamples,
        vis.quality.numslices,
        vis.quality.numstacks,
        vis.quality.numquads,
        vis.map.shadowscale,
        *vis.rgba.fog,
    ]
    if np.any(model.geom_size[planes, :2] <= 0):  # an infinite plane's grid spans zfar * extent
        scalars.append(vis.map.zfar * model.stat.extent)
    digest = hashlib.blake2b(np.asarray(scalars, dtype=np.float64).tobytes(), digest_size=16)
    for arr in (
        model.geom_size[planes],
        model.geom_matid[planes],
        model.mat_texid,
        model.mat_texrepeat,
        model.mat_texuniform,
        model.tex_type,
        model.tex_colorspace,
        model.tex_width,
        model.tex_height,
        model.tex_nchannel,
        model.tex_adr,
        model.tex_data,
    ):
        digest.update(np.ascontiguousarray(arr).tobytes())
    return digest.digest()


class FrameRenderer:
    """Renders RGB frames of any model from a named camera, sharing one GL context.

    ``set_model`` is cheap enough to call every episode: it remakes the geom buffer (``MjvScene``), and
    the ``MjrContext`` (textures, buffers) only when :func:`context_key` says the upload differs.
    ``contexts_made`` counts the contexts made, for tests and benchmarks.
    """

    def __init__(self, width: int, height: int, max_geom: int = 200) -> None:
        self.width, self.height, self.max_geom = width, height, max_geom
        self._ctx, self.backend = gl_context()
        self._model: mujoco.MjModel | None = None
        self._con: mujoco.MjrContext | None = None
        self._scene: mujoco.MjvScene | None = None
        self._key: bytes | None = None
        self.contexts_made = 0
        self._option = mujoco.MjvOption()
        self._pert = mujoco.MjvPerturb()
        self._camera = mujoco.MjvCamera()
        self._rect = mujoco.MjrRect(0, 0, width, height)
        self._rgb = np.empty((height, width, 3), dtype=np.uint8)

    def set_model(self, model: mujoco.MjModel) -> None:
        """Bind ``model``; its offscreen buffer must be at least width x height."""
        if model is self._model:
            return
        if model.vis.global_.offwidth < self.width or model.vis.global_.offheight < self.height:
            model.vis.global_.offwidth = max(self.width, model.vis.global_.offwidth)
            model.vis.global_.offheight = max(self.height, model.vis.global_.offheight)
        self._ctx.make_current()
        key = context_key(model)
        if self._con is not None and key is not None and key == self._key:
            extent = model.stat.extent  # the context's model-scaled scalars, as mjr_makeContext sets them
            self._con.shadowClip = extent * model.vis.map.shadowclip
            self._con.fogStart = extent * model.vis.map.fogstart
            self._con.fogEnd = extent * model.vis.map.fogend
        else:
            if self._con is not None:
                self._con.free()
            self._con = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_100)
            self.contexts_made += 1
        self._key = key
        self._scene = mujoco.MjvScene(model, maxgeom=self.max_geom)
        self._model = model

    def render(self, data: mujoco.MjData, camera: str | int = "cam") -> np.ndarray:
        """Render ``data`` from ``camera`` and return a fresh (H, W, 3) uint8 array."""
        if self._model is None or self._con is None or self._scene is None:
            raise RuntimeError("FrameRenderer.set_model must be called before render")
        model = self._model
        cam_id = camera if isinstance(camera, int) else model.camera(camera).id
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._camera.fixedcamid = cam_id
        mujoco.mjv_updateScene(
            model,
            data,
            self._option,
            self._pert,
            self._camera,
            mujoco.mjtCatBit.mjCAT_ALL,
            self._scene,
        )
        # Several renderers share the GL context: bind this one's offscreen buffer before drawing into it.
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._con)
        mujoco.mjr_render(self._rect, self._scene, self._con)
        mujoco.mjr_readPixels(self._rgb, None, self._rect, self._con)
        return np.flipud(self._rgb).copy()  # OpenGL's origin is bottom-left

    def close(self) -> None:
        """Free the model-bound GL resources; the shared context stays for later renderers."""
        if self._con is not None:
            self._ctx.make_current()
            self._con.free()
        self._con = self._scene = self._model = self._key = None
