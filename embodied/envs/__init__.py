"""Interactive tasks: the policy's answer is executed in MuJoCo and the physics is the reward.

A task is one module, and that module declares everything the rest of the code needs (the protocol is
``PROTOCOL`` below; ``place.py`` is a worked example):

* ``NAME``, ``VERSION`` (bumped whenever what ``make_episode`` makes for a seed changes), ``NUMERIC`` (the
  answer is numbers, else a lettered option) and ``RANK`` (its place in the default ``env.tasks``);
* the episode: ``make_episode(seed, difficulty, width, height, num_frames, fps) -> (record, frames)``;
  records have the MCQ format (``options`` is [] for numeric answers, ``answer`` is "" since there is no
  label), so they are stored and loaded like any generated dataset;
* the answer: ``parse_action(text) -> action | None`` and its inverse ``format_action(action) -> str`` (the
  body of an ``<answer>`` block that parses back to ``action``), ``describe(action)`` in words,
  ``random_answer(rng)`` (a well-formed answer for format-only SFT targets);
* the physics: ``job(record, action) -> core.Job`` and ``outcome(record, action, trace) -> terms``, named
  reward terms with ``reward/total`` their weighted sum by ``WEIGHTS``;
* its failures: ``FAILURES`` (the terms that are -1 when the action failed in that way) and
  ``WORST_OUTCOME`` (the lowest ``reward/total`` an executed action can score; the unparseable penalty of
  :mod:`embodied.envs.reward` is set below every task's worst);
* its baselines and probes: ``CONSTANT_GRID`` (the answers the best-constant baseline tries on every
  episode), ``probe_actions(record, rng, k)`` (answers covering success and failure, for the CPU/Warp
  parity check), ``action_value(action)`` and ``decisive(record)`` (the action and the scene parameter
  that decides the outcome as one number each, for the spread of a policy's answers) and ``DECIDED_BY``
  (that parameter in words, for reports).

Optional: ``CORRECTIONS``, ``{failure term: (action coordinate, sign)}``, the way an action should move
after that failure (push: a short strike wants a larger impulse), which multi-turn evaluation uses to
score the direction of a second answer (`embodied.eval.env_stats.correction_summary`); ``SCENE``, the MJCF
file of a task kept outside this package (shipped tasks keep theirs in ``sim/<NAME>/scene.xml``);
``answer_grid(record) -> (question, [(action, text), ...])``, the lettered
options a numeric task offers under ``env.answer=grid`` (see :func:`answer_form`).

Answer forms (``env.answer``): ``number`` (the default) asks a numeric task for its numbers as text;
``grid`` rewrites each numeric record on load into a lettered question whose options are the task's
``answer_grid`` (kept in ``meta["answer_grid"]``), so that every answer is one letter token, as for
lettered tasks. :func:`parse` reads an answer either way and returns the task's action, which the physics
executes unchanged.

A module of this package that assigns ``NAME`` and defines ``make_episode`` is a task: it is found by
reading the package's sources, without importing them (so that the config, which lists the tasks, loads
without MuJoCo; `embodied.registry`). A task kept elsewhere joins with :func:`register`.

The GRPO reward that executes answers is :func:`embodied.envs.reward.env_reward`: every parseable
completion of a call is executed, all in one batch per task on the ``warp`` backend, and scored by physics.
"""

from __future__ import annotations

import functools
from types import ModuleType

from embodied.questions import is_family
from embodied.registry import Declared, Registry

__all__ = [
    "ANSWER_FORMS",
    "PROTOCOL",
    "TASKS",
    "answer_examples",
    "answer_form",
    "action_seconds",
    "answer_text",
    "execute",
    "grid_action",
    "is_interactive",
    "parse",
    "random_answer",
    "register",
    "render_action",
    "task",
    "task_answer_form",
    "task_names",
    "unregister",
]

PROTOCOL = (
    "NAME",
    "VERSION",
    "NUMERIC",
    "RANK",
    "WEIGHTS",
    "FAILURES",
    "WORST_OUTCOME",
    "CONSTANT_GRID",
    "DECIDED_BY",
    "make_episode",
    "parse_action",
    "format_action",
    "describe",
    "random_answer",
    "job",
    "outcome",
    "probe_actions",
    "action_value",
    "decisive",
)
"""What a task module must define (see the module docstring)."""


def _declares_task(module: Declared) -> bool:
    """A module that assigns ``NAME`` (a string) and defines ``make_episode`` is a task."""
    return isinstance(module.constants.get("NAME"), str) and "make_episode" in module.functions


def _join(module: ModuleType) -> None:
    """What registering a task does besides: its name must not be a question family's (records are told
    apart by name, `data.schema.kind`), and a task kept outside this package brings its scene (``SCENE``)."""
    if is_family(module.NAME):
        raise ValueError(
            f"{module.NAME!r} already names a question family; give the interactive task another NAME"
        )
    if getattr(module, "SCENE", None):
        from embodied.envs.core import add_scene

        add_scene(module.NAME, module.SCENE)


REGISTRY = Registry(
    "interactive task", "embodied.envs", _declares_task, required=PROTOCOL, ranked=True, on_register=_join
)
"""The interactive tasks: the shipped modules of this package, then the registered ones."""

TASKS = REGISTRY.shipped()
"""The tasks shipped in this package, by ``RANK``: the default of ``env.tasks``."""


def task_names() -> tuple[str, ...]:
    """Every known task: the shipped ones, then the registered ones in registration order."""
    return REGISTRY.names()


def register(module: ModuleType) -> ModuleType:
    """Make the task ``module`` (defined anywhere) known by its ``NAME``: episodes, rewards, evaluation,
    the best constant, parity and reports then work on it as on a shipped task, here and in the worker
    processes this one spawns (`embodied.registry.restore`)."""
    return REGISTRY.register(module)


def unregister(name: str) -> None:
    """Forget a task added by :func:`register` (shipped tasks stay)."""
    REGISTRY.unregister(name)


def task(name: str) -> ModuleType:
    """The module of interactive task ``name`` (a shipped one imported and checked on first use)."""
    return REGISTRY.get(name)


def is_interactive(record: dict) -> bool:
    return record.get("task") in REGISTRY


ANSWER_FORMS = ("grid", "number")
"""`env.answer`: how numeric tasks ask for their action (lettered tasks are the same in both)."""


def task_answer_form(spec: str, name: str) -> str:
    """The answer form of task ``name`` under ``env.answer=spec``: one form for every task (``number``,
    ``grid``), or per task as comma-separated ``task=form`` pairs (``push=grid``, ``push=grid,carry=number``),
    a task not named being asked as a number."""
    return spec if spec in ANSWER_FORMS else _answer_forms(spec).get(name, "number")


@functools.lru_cache(maxsize=16)
def _answer_forms(spec: str) -> dict[str, str]:
    """``env.answer``'s ``task=form`` pairs as a dict, parsed and checked once per spec (every loaded record
    asks for its task's form)."""
    forms = {}
    for part in spec.split(","):
        key, sep, form = (s.strip() for s in part.partition("="))
        if not sep or form not in ANSWER_FORMS or not key:
            raise ValueError(
                f"env.answer={spec!r}: give one of {list(ANSWER_FORMS)} for every task, or task=form pairs "
                "separated by commas (e.g. env.answer=push=grid)"
            )
        try:
            task(key)
        except KeyError as e:
            raise ValueError(f"env.answer={spec!r}: {e.args[0]}") from None
        forms[key] = form
    return forms


def answer_form(record: dict, form: str) -> dict:
    """``record`` in answer form ``form`` (one form, or per task: :func:`task_answer_form`): ``number`` is the
    record as generated (with an earlier grid taken back out); ``grid`` turns a numeric task's record into a
    lettered question whose options are its task's ``answer_grid(record)``, the actions kept in
    ``meta["answer_grid"]`` for :func:`parse`. Lettered tasks are returned unchanged; the input is never
    modified."""
    form = task_answer_form(form, record["task"])
    mod = task(record["task"])
    meta = record["meta"]
    if not mod.NUMERIC:
        return record
    if form == "number":
        if "answer_grid" not in meta:
            return record
        base = meta["number_form"]
        rest = {k: v for k, v in meta.items() if k not in ("answer_grid", "number_form")}
        return record | {"question": base["question"], "options": list(base["options"]), "meta": rest}
    if "answer_grid" in meta:
        return record
    if not hasattr(mod, "answer_grid"):
        raise ValueError(
            f"task {mod.NAME!r} defines no answer_grid(record), so it cannot be asked with env.answer=grid; "
            "add one to its module or set env.answer=number"
        )
    question, options = mod.answer_grid(record)
    if not 2 <= len(options) <= 26:
        raise ValueError(f"task {mod.NAME!r}: answer_grid gave {len(options)} options; it needs 2 to 26")
    actions = [list(a) if isinstance(a, tuple | list) else a for a, _ in options]
    number = {"question": record["question"], "options": list(record["options"])}
    meta = meta | {"answer_grid": actions, "number_form": number}
    return record | {"question": question, "options": [t for _, t in options], "meta": meta}


def answer_examples(examples: list, form: str) -> list:
    """``examples`` (anything with a ``record``, e.g. `embodied.data.load.Example`) with every interactive
    record in answer form ``form`` (:func:`answer_form`); MCQs pass through unchanged."""
    import dataclasses

    return [
        dataclasses.replace(e, record=answer_form(e.record, form)) if is_interactive(e.record) else e
        for e in examples
    ]


def grid_action(value):
    """An action as stored in ``meta["answer_grid"]`` (JSON lists) as the task's parser returns it: a tuple of
    floats, or one float."""
    return tuple(float(v) for v in value) if isinstance(value, list | tuple) else float(value)


def parse(record: dict, text: str):
    """The action answered by ``text`` for ``record``, or None when it cannot be parsed: the task's own
    ``parse_action``, or for a record in grid form (:func:`answer_form`) the action of the chosen letter."""
    grid = record.get("meta", {}).get("answer_grid")
    if grid is None:
        return task(record["task"]).parse_action(text)
    from embodied.envs.core import parse_letter

    index = parse_letter(text, len(grid))
    return None if index is None else grid_action(grid[index])


def random_answer(record: dict, rng) -> str:
    """A well-formed completion for ``record`` with a random action on the task's answer grid (a random
    option for a record in grid form): the answer format for SFT (``sft.targets=format``), with no
    physics in it."""
    grid = record.get("meta", {}).get("answer_grid")
    if grid is not None:
        from embodied.questions import LETTERS

        return f"<think></think><answer>{LETTERS[int(rng.integers(len(grid)))]}</answer>"
    return f"<think></think><answer>{task(record['task']).random_answer(rng)}</answer>"


def answer_text(name: str, action, record: dict | None = None) -> str:
    """A well-formed completion of task ``name`` that answers ``action``; for a ``record`` in grid form,
    the letter of that action (an action that is not one of its options is an error)."""
    grid = (record or {}).get("meta", {}).get("answer_grid")
    if grid is not None:
        from embodied.questions import LETTERS

        options = [grid_action(a) for a in grid]
        if action not in options:
            raise ValueError(f"task {name}: {action!r} is not one of this record's options {options}")
        return f"<think></think><answer>{LETTERS[options.index(action)]}</answer>"
    return f"<think></think><answer>{task(name).format_action(action)}</answer>"


def execute(record: dict, action, backend: str = "cpu") -> dict[str, float]:
    """Run one parsed action for ``record`` and return its physics terms (``reward/total`` included)."""
    from embodied.envs.backend import simulate_jobs

    mod = task(record["task"])
    return mod.outcome(record, action, simulate_jobs([mod.job(record, action)], backend)[0])


def render_action(record: dict, action, times, width: int, height: int):
    """Execute ``action`` for ``record`` on the CPU backend and render it: ``(terms, frames (T, H, W, 3))``
    at ``times`` (seconds from the reset; the last at most the episode's length, ``action_seconds``)."""
    from embodied.envs import core
    from embodied.envs.backend import simulate_cpu

    mod = task(record["task"])
    trace, frames = simulate_cpu(mod.job(record, action), times, core.renderer(width, height))
    return mod.outcome(record, action, trace), frames


def action_seconds(record: dict, action) -> float:
    """Simulated seconds of executing ``action`` for ``record`` (the job's length)."""
    job = task(record["task"]).job(record, action)
    return job.n_steps * float(job.model.opt.timestep)
