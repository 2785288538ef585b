"""The package's import graph: no cycles, no reaching into another module's private names.

Every module of `embodied` is parsed (imports inside functions and `if TYPE_CHECKING:` blocks included,
since a deferred import hides a cycle rather than removing it). A module imports a package's submodule
when it names it (`from embodied.data import schema` or `import embodied.data.schema`) and the package's
`__init__` otherwise.
"""

from __future__ import annotations

import ast
from pathlib import Path

import embodied

ROOT = Path(embodied.__file__).parent


def module_names() -> dict[str, Path]:
    """`embodied.x.y` -> its file, for every `.py` file of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ["embodied", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """`(imported module, imported name or "", line)` for each import of an `embodied` module in `path`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "embodied"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "embodied":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub, "", node.lineno) if sub in modules else (base, a.name, node.lineno))
    return found


def graph() -> tuple[dict[str, set[str]], list[str]]:
    """The import graph of `embodied` and every import of a private name from another module."""
    modules = module_names()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private = []
    for name, path in modules.items():
        for target, imported, line in imports(name, path, modules):
            if target not in modules:
                raise AssertionError(f"{path}:{line}: imports {target}, which is not a module of embodied")
            if target != name:
                edges[name].add(target)
            if imported.startswith("_") and target != name:
                private.append(f"{path.relative_to(ROOT.parent)}:{line}: {target}.{imported}")
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    found = cycles(graph()[0])
    assert not found, "import cycles (modules that import each other, directly or not):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_no_private_imports():
    private = graph()[1]
    assert not private, "imports of another module's private name:\n" + "\n".join(private)


def test_the_checker_sees_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
