"""Draw the house from the code's own imports: which room (package, or top-level module) imports which,
the imports that point up the layer order of docs/architecture.md, and the loops between rooms.

    python scripts/house.py                 # this checkout
    python scripts/house.py --root OTHER/embodied --layers docs/architecture.md

Every module of `embodied` is parsed, imports inside functions and `if TYPE_CHECKING:` blocks included: a
deferred import hides a dependency, it does not remove it. `tests/test_house_rules.py` runs the same checks.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS_BEGIN, LAYERS_END = "<!-- layers -->", "<!-- /layers -->"


def module_names(root: Path) -> dict[str, Path]:
    """`embodied.x.y` -> its file, for every `.py` file of the package at `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = ["embodied", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """`(imported module, imported name or "", line)` for each import of an `embodied` module in `path`.
    A module imports a package's submodule when it names it (`from embodied.data import schema`) and the
    package's `__init__` otherwise."""
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


def graph(root: Path) -> tuple[dict[str, set[str]], dict[tuple[str, str], int], list[str]]:
    """The module import graph, the line of each edge's first import, and every import of a private name
    from another module."""
    modules = module_names(root)
    edges: dict[str, set[str]] = {m: set() for m in modules}
    lines: dict[tuple[str, str], int] = {}
    private = []
    for name, path in modules.items():
        for target, imported, line in imports(name, path, modules):
            if target not in modules:
                raise ValueError(f"{path}:{line}: imports {target}, which is not a module of embodied")
            if target != name:
                edges[name].add(target)
                lines.setdefault((name, target), line)
            if imported.startswith("_") and target != name:
                private.append(f"{path.relative_to(root.parent)}:{line}: {target}.{imported}")
    return edges, lines, private


def room(module: str, modules: dict[str, Path] | None = None) -> str:
    """The room of a module: `data/` for `embodied.data.load`, `cli.py` for `embodied.cli`, and `embodied`
    for the package's own `__init__` (a leaf below every room)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "embodied"
    if len(parts) > 2 or (modules is not None and modules[module].name == "__init__.py"):
        return parts[1] + "/"
    return parts[1] + ".py"


def read_layers(doc: Path) -> list[list[str]]:
    """The layer order of docs/architecture.md, top first: the rooms named at the start of each line between
    the `<!-- layers -->` markers (`experiments/  bench/   what to run` is one layer of two rooms)."""
    text = doc.read_text()
    if LAYERS_BEGIN not in text or LAYERS_END not in text:
        raise ValueError(f"{doc}: no {LAYERS_BEGIN} ... {LAYERS_END} block holding the layer order")
    block = text.split(LAYERS_BEGIN, 1)[1].split(LAYERS_END, 1)[0]
    layers = []
    for line in block.splitlines():
        rooms = []
        for token in line.split():
            if not re.fullmatch(r"[a-z_]+(/|\.py)", token):
                break
            rooms.append(token)
        if rooms:
            layers.append(rooms)
    return layers


def upward(edges: dict[str, set[str]], layers: list[list[str]], modules: dict[str, Path]) -> list[tuple]:
    """`(importer, imported)` for every module import whose room sits above the importer's room. A room
    missing from the order is an error (place it)."""
    level = {r: i for i, rooms in enumerate(layers) for r in rooms}
    level["embodied"] = len(layers)  # the package's __init__: version only
    missing = sorted({room(m, modules) for m in modules} - set(level))
    if missing:
        raise ValueError(f"rooms missing from the layer order of docs/architecture.md: {missing}")
    return sorted(
        (a, b)
        for a, targets in edges.items()
        for b in targets
        if level[room(b, modules)] < level[room(a, modules)]
    )


def room_graph(edges: dict[str, set[str]], modules: dict[str, Path]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = defaultdict(set)
    for a, targets in edges.items():
        rooms[room(a, modules)]
        for b in targets:
            if room(a, modules) != room(b, modules):
                rooms[room(a, modules)].add(room(b, modules))
                rooms[room(b, modules)]
    return dict(rooms)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=REPO / "embodied", help="the embodied package folder")
    ap.add_argument("--layers", type=Path, default=REPO / "docs" / "architecture.md")
    args = ap.parse_args()
    modules = module_names(args.root)
    edges, lines, _ = graph(args.root)
    layers = read_layers(args.layers)
    rooms = room_graph(edges, modules)
    print(f"{len(rooms)} rooms on {len(layers)} layers ({args.layers.name}), top first:")
    for rs in layers:
        print("  " + "  ".join(f"{r} -> {sorted(rooms.get(r, ()))}" for r in rs))
    up = upward(edges, layers, modules)
    print(f"\nupward imports: {len(up)}")
    for a, b in up:
        print(f"  {modules[a].relative_to(args.root.parent)}:{lines[a, b]}: {a} -> {b}")
    loops = cycles(rooms)
    print(f"\nloops between rooms: {len(loops)}")
    for c in loops:
        print("  {" + ", ".join(c) + "}")
    print(f"module-level import cycles: {len(cycles(edges))}")


if __name__ == "__main__":
    main()
