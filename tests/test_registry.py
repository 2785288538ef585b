"""One registry for every kind of plugin (issue 61): discovery from sources without importing, lazy import,
register and unregister, one-line errors, and the same re-registration in spawned worker processes for a
question family and an interactive task."""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path

import pytest

from embodied import envs, questions
from embodied.bench import BENCHES
from embodied.data.engine import Source, make_all
from embodied.experiments import EXPERIMENTS
from embodied.registry import Registry, read_module

PACKAGE = "registry_test_widgets"

FAMILY = """
NAME = "registry_toy_family"
VERSION = 3


def num_options(tier, variant=""):
    return 2


def make(world, rng, answer, tier, fam, clip):
    raise NotImplementedError


def verify(record, *args):
    return True


def reasoning_for(record):
    return ""


def trace_for(record):
    return ""
"""

# a toy task: the protocol's constants, then a stub for each of its functions (lower-case names)
TASK = f"""
NAME = "registry_toy_task"
VERSION = 5
NUMERIC = True
RANK = 9
WEIGHTS = {{"reward/success": 1.0}}
FAILURES = ()
WORST_OUTCOME = 0.0
CONSTANT_GRID = [1.0]
DECIDED_BY = "nothing"
{"".join(f"{chr(10)}def {f}(*args):{chr(10)}    return None{chr(10)}" for f in envs.PROTOCOL if f.islower())}
"""


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


def _widget(tmp_path: Path, name: str, text: str) -> Path:
    return _write(tmp_path / PACKAGE, name, text)


@pytest.fixture
def widgets(tmp_path, monkeypatch):
    """A registry of the package `registry_test_widgets` in a temporary folder: a module that assigns
    ``NAME`` declares a widget, which must define ``run`` and its ``RANK``."""
    _widget(tmp_path, "__init__", "")
    _widget(tmp_path, "alpha", 'NAME = "alpha"\nRANK = 1\n\ndef run():\n    return "alpha ran"\n')
    _widget(tmp_path, "beta", 'NAME = "beta"\nRANK = 0\n\ndef run():\n    return "beta ran"\n')
    _widget(tmp_path, "helper", "X = 1\n\ndef run():\n    pass\n")  # no NAME: not a widget
    _widget(tmp_path, "_private", 'NAME = "_private"\nRANK = 2\n')  # private modules are never plugins
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry(
        "widget", PACKAGE, lambda m: isinstance(m.constants.get("NAME"), str), required=("run",), ranked=True
    )
    yield registry
    for name in [n for n in sys.modules if n.split(".")[0] == PACKAGE]:
        del sys.modules[name]


def test_discovery_reads_the_sources_and_imports_on_first_use(widgets):
    assert widgets.shipped() == ("beta", "alpha")  # by RANK
    assert not [n for n in sys.modules if n.split(".")[0] == PACKAGE]  # nothing imported to find them
    assert widgets.get("alpha").run() == "alpha ran"
    assert f"{PACKAGE}.alpha" in sys.modules and f"{PACKAGE}.beta" not in sys.modules
    assert read_module(widgets.folder() / "helper.py").functions == {"run"}


def test_malformed_shipped_plugins_are_refused_naming_the_file(widgets, tmp_path):
    _widget(tmp_path, "gamma", 'NAME = "gamma"\nRANK = 2\n')
    with pytest.raises(ImportError, match=r"gamma\.py: a widget module must define \['run'\]"):
        widgets.shipped()
    _widget(tmp_path, "gamma", 'NAME = "gamma"\n\ndef run():\n    pass\n')
    with pytest.raises(ImportError, match=r"gamma\.py: a shipped widget needs RANK = <int>"):
        widgets.shipped()
    _widget(tmp_path, "gamma", 'NAME = "gamma"\nRANK = 1\n\ndef run():\n    pass\n')
    with pytest.raises(ImportError, match="two widgets share a RANK"):
        widgets.shipped()
    _widget(tmp_path, "gamma", 'NAME = "delta"\nRANK = 2\n\ndef run():\n    pass\n')
    with pytest.raises(ImportError, match=r"gamma\.py: NAME = 'delta'"):
        widgets.shipped()


def test_register_and_unregister(widgets):
    extra = types.ModuleType("extra")
    extra.NAME, extra.run = "extra", lambda: "extra ran"
    assert widgets.register(extra) is extra and widgets.register(extra) is extra  # twice: the same one
    assert widgets.names() == ("beta", "alpha", "extra") and "extra" in widgets
    assert widgets.get("extra").run() == "extra ran" and widgets.all()["alpha"].run() == "alpha ran"
    widgets.unregister("extra")
    assert "extra" not in widgets and widgets.names() == ("beta", "alpha")
    with pytest.raises(TypeError, match=r"half is not a widget: it lacks \['run'\]"):
        widgets.register(types.ModuleType("half"))


def test_an_unknown_name_is_one_line_naming_the_known_ones(widgets):
    for get, known in [
        (widgets.get, ["beta", "alpha"]),
        (questions.family, list(questions.FAMILIES)),
        (envs.task, list(envs.TASKS)),
        (EXPERIMENTS.get, list(EXPERIMENTS.names())),
        (BENCHES.get, list(BENCHES.names())),
    ]:
        with pytest.raises(KeyError) as caught:
            get("nope")
        message = caught.value.args[0]
        assert "\n" not in message and message.startswith("unknown ") and f"known: {known}" in message


def test_a_duplicate_is_refused_naming_both_files(widgets, tmp_path):
    twin = _load(_write(tmp_path / "elsewhere", "alpha", 'NAME = "alpha"\n\ndef run():\n    pass\n'))
    shipped = widgets.folder() / "alpha.py"
    with pytest.raises(
        ValueError, match=rf"^{twin.__file__}: a widget named 'alpha' is already known \({shipped}\)$"
    ):
        widgets.register(twin)
    spatial = questions.family("spatial_puzzle")
    with pytest.raises(ValueError, match=r"spatial_puzzle\.py: a question family named 'spatial_puzzle' is"):
        questions.register(spatial)


def _load(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _KnownNames(Source):
    """A source whose one job reports what its process knows: the families and tasks, and the file each
    registered one was loaded from."""

    def jobs(self) -> list:
        return [0]

    def make(self, job) -> list:
        task, family = envs.task("registry_toy_task"), questions.family("registry_toy_family")
        return [(questions.family_names(), envs.task_names(), task.__file__, family.VERSION, task.VERSION)]


def test_a_spawned_worker_registers_again_what_its_parent_registered(tmp_path):
    family = _load(_write(tmp_path / "plugins", "registry_toy_family", FAMILY))
    task_path = _write(tmp_path / "plugins", "registry_toy_task", TASK)
    task = _load(task_path)
    questions.register(family)
    envs.register(task)
    try:
        source = _KnownNames(None, str(tmp_path / "out"), [], workers=1)
        [[known]] = make_all(source, source.jobs(), workers=1, progress=False)
    finally:
        envs.unregister("registry_toy_task")
        questions.unregister("registry_toy_family")
    family_names, task_names, task_file, family_version, task_version = known
    assert family_names[-1] == "registry_toy_family" and task_names[-1] == "registry_toy_task"
    assert (task_file, family_version, task_version) == (str(task_path), 3, 5)


PACKAGE_ROOT = Path(questions.__file__).parents[1]


def _calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, ast.Call)]


def _dotted(node: ast.AST) -> str:
    """`a.b.c` of a name or attribute chain ('' for anything else)."""
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def test_plugins_are_discovered_in_one_place():
    """Only `embodied/registry.py` reads module sources (`ast.parse`) or walks a package (`pkgutil`,
    `submodule_search_locations`): every kind of plugin is found by the same code."""
    found = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        if path == PACKAGE_ROOT / "registry.py":
            continue
        text = path.read_text()
        uses = [_dotted(c.func) for c in _calls(path)]
        if "ast.parse" in uses or "pkgutil" in text or "submodule_search_locations" in text:
            found.append(str(path.relative_to(PACKAGE_ROOT)))
    assert not found, f"plugin discovery outside embodied/registry.py: {found}"


def test_every_spawned_pool_registers_the_parents_plugins_again():
    """Every process pool in `embodied` starts its workers with an initializer (`registry.restore`, or the
    data engine's, which calls it), so a plugin registered from outside is known in its workers."""
    bare = [
        f"{path.relative_to(PACKAGE_ROOT)}:{call.lineno}"
        for path in sorted(PACKAGE_ROOT.rglob("*.py"))
        for call in _calls(path)
        if _dotted(call.func).rpartition(".")[2] in ("Pool", "ProcessPoolExecutor")
        and not any(k.arg in ("initializer", None) for k in call.keywords)
    ]
    assert not bare, f"process pools whose workers do not restore the registrations: {bare}"
