"""Physics backends for interactive episodes: CPU MuJoCo, or batched MuJoCo Warp.

Both take a list of :class:`~embodied.envs.core.Job` and return one :class:`~embodied.envs.core.Trace`
per job, read at the same steps, so the tasks' ``outcome`` functions cannot tell them apart.

* ``cpu``: MuJoCo's C engine, one episode after another (float64). The default, and what tests use.
* ``warp``: MuJoCo Warp (``pip install mujoco-warp``), every episode of a task in one batch of worlds
  (float32), on CUDA when a GPU is present and on Warp's CPU device otherwise. Per-episode parameters
  travel as per-world model fields, which is why each task keeps one scene structure.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence

import mujoco
import numpy as np

from embodied.envs.core import DERIVED_FIELDS, READ_EVERY, EnvError, Job, Trace, base_model

BACKENDS = ("cpu", "warp")
_BAD_STATE = (
    mujoco.mjtWarning.mjWARN_BADQPOS,
    mujoco.mjtWarning.mjWARN_BADQVEL,
    mujoco.mjtWarning.mjWARN_BADQACC,
)


def simulate_jobs(jobs: Sequence[Job], backend: str = "cpu") -> list[Trace]:
    """Simulate ``jobs`` on ``backend`` (``cpu`` or ``warp``); traces come back in job order."""
    if backend == "cpu":
        return [simulate_cpu(job)[0] for job in jobs]
    if backend == "warp":
        return _run_warp(jobs)
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


def _run_warp(jobs: Sequence[Job]) -> list[Trace]:
    """Group jobs by task (one model structure each) and simulate each group as one batch of worlds."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, job in enumerate(jobs):
        groups[job.task].append(i)
    traces: list[Trace | None] = [None] * len(jobs)
    for index in groups.values():
        for i, trace in zip(index, _warp_batch([jobs[i] for i in index])):
            traces[i] = trace
    return traces  # type: ignore[return-value]


def _warp_batch(jobs: list[Job]) -> list[Trace]:
    """All ``jobs`` (one task) as worlds of one MuJoCo Warp batch, stepped in lockstep."""
    wp, mjw = _import_warp()
    task, n = jobs[0].task, len(jobs)
    counts = [[k for k, _ in job.phases] for job in jobs]
    if any(c != counts[0] for c in counts):
        raise EnvError(f"task {task}: episodes of one batch must share their phase lengths, got {counts}")
    base = base_model(task)
    names = sorted(
        {f for job in jobs for f in job.fields} | (set(DERIVED_FIELDS) if jobs[0].fields else set())
    )
    with wp.ScopedDevice(warp_device()):
        try:
            m = mjw.put_model(base, batch_sizes={f: n for f in names})
            for f in names:
                arr = getattr(m, f)
                arr.assign(np.stack([getattr(job.model, f) for job in jobs]).astype(arr.numpy().dtype))
            nconmax, njmax = (max(sizes) for sizes in zip(*(job.warp_sizes for job in jobs)))
            d = mjw.make_data(base, nworld=n, nconmax=nconmax, njmax=njmax)
            d.qpos.assign(np.stack([job.qpos for job in jobs]).astype(np.float32))
            d.qvel.assign(np.stack([job.qvel for job in jobs]).astype(np.float32))
            mjw.forward(m, d)
            rows = [_warp_read(d)]
            chunk = _stepper(wp, mjw, m, d)
            for p, (k, _) in enumerate(jobs[0].phases):
                d.ctrl.assign(np.stack([job.phases[p][1] for job in jobs]).astype(np.float32))
                for _ in range(k // READ_EVERY):
                    chunk()
                    rows.append(_warp_read(d))
            overflow = d.overflow.numpy().copy()  # per-world bitmask of exhausted buffers
        except Exception as e:
            seeds = [job.seed for job in jobs]
            raise EnvError(f"task {task}, seeds {seeds}: MuJoCo Warp failed: {e}") from e
    traces = []
    for w, job in enumerate(jobs):
        if np.any(overflow[w] != 0):
            raise EnvError(
                f"task {task}, seed {job.seed}: MuJoCo Warp overflowed its buffers (flags "
                f"{int(overflow[w])}); raise the task's WARP_SIZES (contacts, constraint rows)"
            )
        trace = Trace(
            *(np.stack([r[j][w] for r in rows]).astype(np.float64) for j in range(3)), _rows_time(rows)
        )
        _check_finite(job, trace, "warp")
        traces.append(trace)
    return traces


def _rows_time(rows: list[tuple]) -> np.ndarray:
    return np.asarray([float(r[3][0]) for r in rows])


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
