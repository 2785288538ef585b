"""Physics backends for interactive episodes: CPU MuJoCo, or batched MuJoCo Warp or MJX.

Each takes a list of :class:`~embodied.envs.core.Job` and returns one :class:`~embodied.envs.core.Trace`
per job, read at the same steps, so the tasks' ``outcome`` functions cannot tell them apart.

* ``cpu``: MuJoCo's C engine, one episode after another (float64). The default, and what tests use.
* ``warp``: MuJoCo Warp (``pip install mujoco-warp``), every episode of a task in one batch of worlds
  (float32), on CUDA when a GPU is present and on Warp's CPU device otherwise.
* ``mjx``: MJX, MuJoCo in JAX (``pip install mujoco-mjx jax``; ``jax[cuda12]`` for a GPU), its JAX
  implementation: every episode of a task is one world of a ``jax.vmap`` and the whole episode one jitted
  program (float32, JAX's default), on the GPU when JAX sees one, else on JAX's CPU. Batches are padded to
  a power of two; each new padded size or episode length compiles once per process (:func:`mjx_device`
  names the device).

The batched backends share everything but the stepping (:func:`_batch_of`, :func:`_batch_traces`):
per-episode parameters travel as per-world model fields, which is why each task keeps one scene structure.
"""

from __future__ import annotations

import contextlib
import functools
import io
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

from embodied.envs.core import DERIVED_FIELDS, READ_EVERY, EnvError, Job, Trace, base_model

BACKENDS = ("cpu", "warp", "mjx")
_BAD_STATE = (
    mujoco.mjtWarning.mjWARN_BADQPOS,
    mujoco.mjtWarning.mjWARN_BADQVEL,
    mujoco.mjtWarning.mjWARN_BADQACC,
)


def simulate_jobs(jobs: Sequence[Job], backend: str = "cpu") -> list[Trace]:
    """Simulate ``jobs`` on ``backend`` (one of ``BACKENDS``); traces come back in job order."""
    if backend == "cpu":
        return [simulate_cpu(job)[0] for job in jobs]
    if backend == "warp":
        return _by_task(jobs, _warp_batch)
    if backend == "mjx":
        return _by_task(jobs, _mjx_batch)
    raise ValueError(f"env backend {backend!r} is unknown; choose one of {BACKENDS}")


def backend_device(backend: str) -> str:
    """Where ``backend`` runs, in words (``cpu``: MuJoCo's C engine on this machine's CPU); an ImportError
    names what to install when the backend's package is missing."""
    if backend == "cpu":
        return "cpu (MuJoCo C)"
    if backend == "warp":
        return warp_device()
    if backend == "mjx":
        return mjx_device()
    raise ValueError(f"env backend {backend!r} is unknown; choose one of {BACKENDS}")


def simulate_cpu(job: Job, render_times: Sequence[float] = (), renderer=None) -> tuple[Trace, np.ndarray]:
    """Run one job with MuJoCo on the CPU; optionally render frames ``(T, H, W, 3)`` at ``render_times``.

    Frames are rendered at the first readout at or after each time, from camera ``cam``.
    """
    model = job.model
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:] = job.qpos, job.qvel
    mujoco.mj_forward(model, data)
    times = np.asarray(render_times, dtype=float)
    frames: list[np.ndarray] = []
    if times.size:
        renderer.set_model(model)
    rows: list[tuple] = []

    def read() -> None:
        rows.append((data.qpos.copy(), data.qvel.copy(), data.sensordata.copy(), data.time))
        while len(frames) < times.size and data.time >= times[len(frames)] - 1e-9:
            frames.append(renderer.render(data, "cam"))

    try:
        read()
        for n, ctrl in job.phases:
            data.ctrl[:] = ctrl
            for _ in range(n // READ_EVERY):
                mujoco.mj_step(model, data, nstep=READ_EVERY)
                read()
    except Exception as e:
        raise EnvError(f"task {job.task}, seed {job.seed}: MuJoCo (cpu) failed: {e}") from e
    bad = [w for w in _BAD_STATE if data.warning[w].number > 0]
    if bad:  # MuJoCo resets a diverged state with only a warning: never let that pass as an outcome
        names = [mujoco.mjtWarning(w).name for w in bad]
        raise EnvError(f"task {job.task}, seed {job.seed}: the cpu simulation diverged ({names})")
    if len(frames) < times.size:
        raise ValueError(f"task {job.task}: render times {times.tolist()} run past the episode's end")
    trace = _trace(rows)
    _check_finite(job, trace, "cpu")
    return trace, (np.stack(frames) if frames else np.zeros((0, 0, 0, 3), np.uint8))


def _trace(rows: list[tuple]) -> Trace:
    qpos, qvel, sens, t = zip(*rows)
    return Trace(np.stack(qpos), np.stack(qvel), np.stack(sens), np.asarray(t))


def _check_finite(job: Job, trace: Trace, backend: str) -> None:
    if not (np.isfinite(trace.qpos).all() and np.isfinite(trace.qvel).all()):
        raise EnvError(f"task {job.task}, seed {job.seed}: the {backend} simulation diverged (NaN state)")


# --- what the batched backends share ------------------------------------------------------------------


def _by_task(jobs: Sequence[Job], batch: Callable[[list[Job]], list[Trace]]) -> list[Trace]:
    """Group jobs by task (one model structure each) and simulate each group as one ``batch`` of worlds."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, job in enumerate(jobs):
        groups[job.task].append(i)
    traces: list[Trace | None] = [None] * len(jobs)
    for index in groups.values():
        for i, trace in zip(index, batch([jobs[i] for i in index])):
            traces[i] = trace
    return traces  # type: ignore[return-value]


@dataclass
class _Batch:
    """The jobs of one task as per-world arrays (float64, as built): ``fields`` maps each model field that
    varies per episode to ``(n, ...)``; ``ctrl`` holds one ``(n, nu)`` array per phase, ``steps`` its
    length."""

    task: str
    base: mujoco.MjModel
    fields: dict[str, np.ndarray]
    qpos: np.ndarray
    qvel: np.ndarray
    steps: list[int]
    ctrl: list[np.ndarray]


def _batch_of(jobs: list[Job]) -> _Batch:
    task = jobs[0].task
    counts = [[k for k, _ in job.phases] for job in jobs]
    if any(c != counts[0] for c in counts):
        raise EnvError(f"task {task}: episodes of one batch must share their phase lengths, got {counts}")
    names = sorted(
        {f for job in jobs for f in job.fields} | (set(DERIVED_FIELDS) if jobs[0].fields else set())
    )
    fields = {f: np.stack([getattr(job.model, f) for job in jobs]) for f in names}
    ctrl = [np.stack([job.phases[p][1] for job in jobs]) for p in range(len(counts[0]))]
    qpos, qvel = np.stack([job.qpos for job in jobs]), np.stack([job.qvel for job in jobs])
    return _Batch(task, base_model(task), fields, qpos, qvel, counts[0], ctrl)


def _batch_traces(jobs: list[Job], qpos, qvel, sensordata, time: np.ndarray, backend: str) -> list[Trace]:
    """One trace per world from readouts stacked as ``(K, n, ...)`` (``time``: ``(K,)``)."""
    traces = []
    for w, job in enumerate(jobs):
        trace = Trace(*(np.asarray(a[:, w], dtype=np.float64) for a in (qpos, qvel, sensordata)), time)
        _check_finite(job, trace, backend)
        traces.append(trace)
    return traces


# --- MuJoCo Warp ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def warp_device() -> str:
    """``cuda:0`` when Warp sees a GPU, else ``cpu`` (Warp's CPU device, compiled with LLVM)."""
    wp = _import_warp()[0]
    return "cuda:0" if wp.is_cuda_available() else "cpu"


@functools.lru_cache(maxsize=1)
def _import_warp():
    try:
        import warp as wp

        # Before Warp initialises: no banner and no per-module load timings, warnings still shown.
        wp.config.log_level = wp.LOG_WARNING
        import mujoco_warp as mjw
    except ImportError as e:
        raise ImportError(
            "env backend 'warp' needs MuJoCo Warp: `pip install mujoco-warp` (or `pip install "
            "embodied[gpu-sim]`); use env.backend=cpu otherwise"
        ) from e
    return wp, mjw


def _warp_batch(jobs: list[Job]) -> list[Trace]:
    """All ``jobs`` (one task) as worlds of one MuJoCo Warp batch, stepped in lockstep."""
    wp, mjw = _import_warp()
    b, n = _batch_of(jobs), len(jobs)
    with wp.ScopedDevice(warp_device()):
        try:
            m = mjw.put_model(b.base, batch_sizes={f: n for f in b.fields})
            for f, value in b.fields.items():
                arr = getattr(m, f)
                arr.assign(value.astype(arr.numpy().dtype))
            nconmax, njmax = (max(sizes) for sizes in zip(*(job.warp_sizes for job in jobs)))
            d = mjw.make_data(b.base, nworld=n, nconmax=nconmax, njmax=njmax)
            d.qpos.assign(b.qpos.astype(np.float32))
            d.qvel.assign(b.qvel.astype(np.float32))
            mjw.forward(m, d)
            rows = [_warp_read(d)]
            chunk = _stepper(wp, mjw, m, d)
            for k, ctrl in zip(b.steps, b.ctrl):
                d.ctrl.assign(ctrl.astype(np.float32))
                for _ in range(k // READ_EVERY):
                    chunk()
                    rows.append(_warp_read(d))
            overflow = d.overflow.numpy().copy()  # per-world bitmask of exhausted buffers
        except Exception as e:
            seeds = [job.seed for job in jobs]
            raise EnvError(f"task {b.task}, seeds {seeds}: MuJoCo Warp failed: {e}") from e
    for w, job in enumerate(jobs):
        if np.any(overflow[w] != 0):
            raise EnvError(
                f"task {b.task}, seed {job.seed}: MuJoCo Warp overflowed its buffers (flags "
                f"{int(overflow[w])}); raise the task's WARP_SIZES (contacts, constraint rows)"
            )
    qpos, qvel, sens, time = (np.stack([r[j] for r in rows]) for j in range(4))
    return _batch_traces(jobs, qpos, qvel, sens, time[:, 0].astype(np.float64), "warp")


def _warp_read(d) -> tuple:
    # On Warp's CPU device .numpy() is a view of the live buffer: copy, or every row is the last state.
    return tuple(a.numpy().copy() for a in (d.qpos, d.qvel, d.sensordata, d.time))


def _stepper(wp, mjw, m, d):
    """A function advancing all worlds READ_EVERY steps: a captured CUDA graph on GPU, a loop on CPU."""
    if wp.get_device().is_cuda:
        with wp.ScopedCapture() as capture:
            for _ in range(READ_EVERY):
                mjw.step(m, d)
        return lambda: wp.capture_launch(capture.graph)

    def loop() -> None:
        for _ in range(READ_EVERY):
            mjw.step(m, d)

    return loop


# --- MJX (MuJoCo in JAX) -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _import_mjx():
    try:
        import jax

        # MJX prints "Failed to import warp" when warp-lang is absent; its JAX implementation, used here,
        # does not need it.
        with contextlib.redirect_stdout(io.StringIO()):
            from mujoco import mjx
    except ImportError as e:
        raise ImportError(
            "env backend 'mjx' needs MJX and JAX: `pip install mujoco-mjx jax` (or `pip install "
            "embodied[gpu-sim-mjx]`; `jax[cuda12]` for a GPU); use env.backend=cpu otherwise"
        ) from e
    return jax, mjx


@functools.lru_cache(maxsize=1)
def mjx_device() -> str:
    """The JAX device MJX runs on, e.g. ``gpu (NVIDIA H100 80GB HBM3)`` or ``cpu (cpu)``: JAX's default
    device, which is a GPU whenever JAX sees one."""
    device = _import_mjx()[0].devices()[0]
    return f"{device.platform} ({device.device_kind})"


_MJX_MODELS: dict[str, tuple] = {}


def _mjx_model(task: str) -> tuple:
    """The task's base model and an empty state on the JAX device (placed once per process)."""
    if task not in _MJX_MODELS:
        mjx = _import_mjx()[1]
        m = mjx.put_model(base_model(task), impl="jax")
        _MJX_MODELS[task] = (m, mjx.make_data(m))
    return _MJX_MODELS[task]


@functools.lru_cache(maxsize=1)
def _mjx_program():
    """``run(m, d, fields, qpos, qvel, ctrl)``: every world's whole episode, jitted; ``fields``, ``qpos``,
    ``qvel`` per world ``(n, ...)``, ``ctrl`` per readout ``(R, n, nu)``; returns the readouts
    ``(qpos, qvel, sensordata, time)``, each ``(n, R + 1, ...)``, the state after ``forward`` first."""
    jax, mjx = _import_mjx()

    def read(d) -> tuple:
        return d.qpos, d.qvel, d.sensordata, d.time

    def world(m, d, fields, qpos, qvel, ctrl):
        m = m.replace(**fields)
        d = mjx.forward(m, d.replace(qpos=qpos, qvel=qvel))

        def chunk(d, c):
            d = jax.lax.fori_loop(0, READ_EVERY, lambda _, x: mjx.step(m, x), d.replace(ctrl=c))
            return d, read(d)

        _, rows = jax.lax.scan(chunk, d, ctrl)
        return tuple(jax.numpy.concatenate([a[None], r]) for a, r in zip(read(d), rows))

    return jax.jit(jax.vmap(world, in_axes=(None, None, 0, 0, 0, 1)))


def _mjx_batch(jobs: list[Job]) -> list[Trace]:
    """All ``jobs`` (one task) as the worlds of one vmapped, jitted MJX episode."""
    jax, _ = _import_mjx()
    b, n = _batch_of(jobs), len(jobs)
    # Pad to a power of two with copies of the first world: a new batch size compiles the program again
    # (tens of seconds), and a training run's batches vary from call to call.
    pad = [0] * ((1 << (n - 1).bit_length()) - n)

    def worlds(a: np.ndarray, axis: int = 0) -> np.ndarray:
        a = np.concatenate([a, np.take(a, pad, axis=axis)], axis=axis) if pad else a
        return a.astype(np.float32)

    ctrl = np.concatenate([np.repeat(c[None], k // READ_EVERY, axis=0) for k, c in zip(b.steps, b.ctrl)])
    try:
        m, d = _mjx_model(b.task)
        f32 = {f: worlds(v) for f, v in b.fields.items()}
        rows = jax.device_get(_mjx_program()(m, d, f32, worlds(b.qpos), worlds(b.qvel), worlds(ctrl, 1)))
    except Exception as e:
        seeds = [job.seed for job in jobs]
        raise EnvError(f"task {b.task}, seeds {seeds}: MJX failed: {e}") from e
    qpos, qvel, sens, time = (np.swapaxes(np.asarray(a)[:n], 0, 1) for a in rows)  # (K, n, ...)
    return _batch_traces(jobs, qpos, qvel, sens, time[:, 0].astype(np.float64), "mjx")
