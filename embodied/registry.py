"""One registry for every kind of plugin: question families, interactive tasks, model architectures,
experiments and benchmarks are each a `Registry` of one package.

A kind's shipped plugins are the modules of its package that declare one (its `declares` rule on what a
module's top level binds: ``NAME`` and ``verify``, a ``run`` function, an ``ARCHITECTURE``...). They are
found by reading the sources with `ast`, not by importing them, so that the config, `embodied --help` and
the lists of names load without torch or MuJoCo; a shipped plugin is imported on its first use. A plugin
kept elsewhere joins with `Registry.register`. Registration lives in one process, so every spawned worker
process starts with `restore(carried())` (its pool's initializer): what the parent registered from a file is
registered again there, the same for every kind.

Why not explicit tables of module names, as mujoco_playground keeps (weighed in issue 68): a table would
replace only the scanning (`Declared`, `read_module`, `scan`, `_declared`, ranks and dashes: about 90 of
these lines) with a second place to edit per plugin; registering outside plugins and carrying them into
spawned workers (`carried`, `restore`) is needed either way, and neither imports torch for `embodied --help`.

This module stands at the bottom of the house: it imports nothing of `embodied`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

_REGISTRIES: dict[str, Registry] = {}
"""Every registry built in this process, by package (`carried`, `registry_of`)."""


@dataclass(frozen=True)
class Declared:
    """What a module's top level binds, as its source spells it."""

    path: Path
    names: frozenset[str]
    """Every name bound: functions, classes, imports and assignments."""
    functions: frozenset[str]
    """The functions it defines (``def``)."""
    constants: dict[str, object] = field(default_factory=dict)
    """The names it assigns a literal (``NAME = "place"``, ``RANK = 0``)."""


def read_module(path: Path) -> Declared:
    """The names ``path``'s module binds at its top level, read from its source (nothing imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names: set[str] = set()
    functions: set[str] = set()
    constants: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions.add(node.name)
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in (t for t in targets if isinstance(t, ast.Name)):
                names.add(t.id)
                if isinstance(node.value, ast.Constant):
                    constants[t.id] = node.value.value
    return Declared(path, frozenset(names), frozenset(functions), constants)


def _itself(module: ModuleType) -> object:
    return module


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


class Registry:
    """The plugins of one kind: those shipped in ``package`` (found by `declares`), then those registered.

    ``required``: the names a plugin must define (checked in the source of a shipped module, and on the
    plugin itself when it is imported or registered); ``ranked``: a shipped plugin's module assigns
    ``RANK = <int>``, its place in `shipped` (else they are in name order); ``dashes``: a name spells its
    module's ``_`` as ``-``; ``member``: the plugin a module holds (the module itself, or e.g. its
    ``ARCHITECTURE``); ``name_of``: a plugin's name (by default its ``NAME``, else a module's own name);
    ``check``: what else a plugin must be
    (it raises to refuse one); ``on_register``: what joining from outside does besides (it may refuse too).
    A module that assigns ``NAME`` is named after it. The package must build its registry on import."""

    def __init__(
        self,
        kind: str,
        package: str,
        declares: Callable[[Declared], bool],
        *,
        required: tuple[str, ...] = (),
        ranked: bool = False,
        dashes: bool = False,
        member: Callable[[ModuleType], object] = _itself,
        name_of: Callable[[object], object] | None = None,
        check: Callable[[object], None] | None = None,
        on_register: Callable[[object], None] | None = None,
    ) -> None:
        self.kind, self.package, self.declares = kind, package, declares
        self.required, self.ranked, self.dashes = required, ranked, dashes
        self.member, self.name_of = member, name_of or self._name
        self.check, self.on_register = check, on_register
        self._shipped: tuple[str, ...] | None = None
        self._loaded: dict[str, object] = {}
        self._registered: dict[str, object] = {}
        _REGISTRIES[package] = self

    def _name(self, plugin: object) -> object:
        """A plugin's ``NAME``, or else a module's own (last) name, dashed when `dashes`."""
        if hasattr(plugin, "NAME") or not isinstance(plugin, ModuleType):
            return getattr(plugin, "NAME", None)
        stem = plugin.__name__.rpartition(".")[2]
        return stem.replace("_", "-") if self.dashes else stem

    def folder(self) -> Path:
        """The package's folder, found without importing the package (only its parents)."""
        return Path(next(iter(importlib.util.find_spec(self.package).submodule_search_locations)))

    def scan(self, folder: Path) -> tuple[str, ...]:
        """The names of the plugins the modules of ``folder`` declare, by ``RANK`` when ranked (else by
        name). A declared plugin that lacks a required name or its ``RANK`` is an ImportError naming its file
        and what it lacks, and so are two that share a ``RANK``."""
        sources = [read_module(path) for path in sorted(folder.glob("[!_]*.py"))]
        found = [self._declared(source) for source in sources if self.declares(source)]
        ranks = [rank for rank, _ in found]
        if len(set(ranks)) != len(ranks) and self.ranked:
            raise ImportError(f"{folder}: two {self.kind}s share a RANK: {sorted(found)}")
        return tuple(name for _, name in sorted(found))

    def _declared(self, source: Declared) -> tuple[int, str]:
        """``(RANK, name)`` of the plugin that ``source`` declares (RANK 0 when unranked), or why not."""
        name = source.path.stem.replace("_", "-") if self.dashes else source.path.stem
        said = source.constants.get("NAME")
        if isinstance(said, str) and said != name:
            raise ImportError(
                f"{source.path}: NAME = {said!r}, but {_a(self.kind)}'s module is named after it"
            )
        missing = [k for k in self.required if k not in source.names]
        if missing:
            raise ImportError(f"{source.path}: {_a(self.kind)} module must define {missing} ({self.package})")
        rank = source.constants.get("RANK", 0 if not self.ranked else None)
        if not isinstance(rank, int):
            raise ImportError(
                f"{source.path}: a shipped {self.kind} needs RANK = <int> (its place among the "
                f"{self.kind}s, the first the default)"
            )
        return rank, name

    def shipped(self) -> tuple[str, ...]:
        """The plugins of the package, discovered once."""
        if self._shipped is None:
            self._shipped = self.scan(self.folder())
        return self._shipped

    def names(self) -> tuple[str, ...]:
        """Every known plugin: the shipped ones, then the registered ones in registration order."""
        return self.shipped() + tuple(self._registered)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._registered or name in self.shipped())

    def get(self, name: str) -> object:
        """The plugin ``name`` (a shipped one imported and checked on first use); an unknown name is a
        KeyError listing the known ones."""
        if name in self._registered:
            return self._registered[name]
        if name not in self.shipped():
            raise KeyError(f"unknown {self.kind} {name!r}; known: {list(self.names())}")
        if name not in self._loaded:
            module = importlib.import_module(f"{self.package}.{name.replace('-', '_')}")
            plugin = self._checked(self.member(module), module.__file__)
            if self.name_of(plugin) != name:
                raise ImportError(
                    f"{module.__file__}: its {self.kind} is named {self.name_of(plugin)!r}, not {name!r}"
                )
            self._loaded[name] = plugin
        return self._loaded[name]

    def all(self) -> dict[str, object]:
        """Every plugin by name, the shipped ones imported."""
        return {name: self.get(name) for name in self.names()}

    def _checked(self, plugin: object, where: str) -> object:
        missing = [k for k in self.required if not hasattr(plugin, k)]
        if missing:
            raise TypeError(f"{where} is not {_a(self.kind)}: it lacks {missing} ({self.package})")
        if self.check is not None:
            self.check(plugin)
        return plugin

    def _where(self, name: str) -> str:
        """The file of known plugin ``name``."""
        if name in self._registered:
            return _file_of(self._registered[name]) or _module_of(self._registered[name])
        return str(self.folder() / f"{name.replace('-', '_')}.py")

    def register(self, plugin: object) -> object:
        """Make ``plugin`` (defined anywhere) known by its name, in this process and (from its file) in the
        worker processes it spawns. A plugin that lacks a required name, or whose name is already known, is
        refused in one line naming its file."""
        where = _file_of(plugin) or _module_of(plugin)
        self._checked(plugin, where)
        name = self.name_of(plugin)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where}: {_a(self.kind)} needs a name (a non-empty string), got {name!r}")
        if self._registered.get(name) is plugin:
            return plugin
        if name in self:
            raise ValueError(
                f"{where}: {_a(self.kind)} named {name!r} is already known ({self._where(name)})"
            )
        if self.on_register is not None:
            self.on_register(plugin)
        self._registered[name] = plugin
        return plugin

    def unregister(self, name: str) -> None:
        """Forget a plugin added by `register` (shipped ones stay)."""
        self._registered.pop(name, None)


def _file_of(plugin: object) -> str | None:
    """The source file of a plugin: a module's own, or the module defining an instance's class."""
    module = plugin if isinstance(plugin, ModuleType) else sys.modules.get(type(plugin).__module__)
    return getattr(module, "__file__", None)


def _module_of(plugin: object) -> str:
    return plugin.__name__ if isinstance(plugin, ModuleType) else type(plugin).__module__


def registry_of(package: str) -> Registry:
    """The registry of ``package`` (which builds it when imported)."""
    if package not in _REGISTRIES:
        importlib.import_module(package)
    if package not in _REGISTRIES:
        raise KeyError(f"{package} holds no plugin registry; registries: {sorted(_REGISTRIES)}")
    return _REGISTRIES[package]


def carried() -> list[tuple[str, str, str, str]]:
    """``(package, name, module, file)`` of every plugin registered in this process that lives in a file,
    in registration order: what a spawned worker process needs to register them again (`restore`)."""
    return [
        (package, name, _module_of(plugin), file)
        for package, registry in _REGISTRIES.items()
        for name, plugin in registry._registered.items()
        if (file := _file_of(plugin))
    ]


def restore(entries: Iterable[tuple[str, str, str, str]]) -> None:
    """Register, from their files, the plugins of ``entries`` (`carried` in the parent) that this process
    does not know yet: the initializer of every spawned worker process."""
    for package, name, module_name, file in entries:
        registry = registry_of(package)
        if name in registry:
            continue
        module = _load(module_name, file)
        if name not in registry:  # a module may register itself when it runs
            registry.register(registry.member(module))


def _load(module_name: str, file: str) -> ModuleType:
    """The module in ``file``: imported by its name where that finds the same file (a package's module keeps
    its relative imports), else run from the file under that name (or a fresh one where it is taken)."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin == file:
        return importlib.import_module(module_name)
    if getattr(sys.modules.get(module_name), "__file__", None) == file:
        return sys.modules[module_name]
    if module_name in sys.modules or module_name.startswith("__"):
        module_name = f"embodied_plugin_{Path(file).stem}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
