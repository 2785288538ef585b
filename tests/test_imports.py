"""The package's import graph: the layer order of docs/architecture.md holds, no loops, no private names.

Every module of `embodied` is parsed (imports inside functions and `if TYPE_CHECKING:` blocks included,
since a deferred import hides a dependency rather than removing it). A module imports a package's
submodule when it names it (`from embodied.data import schema` or `import embodied.data.schema`) and the
package's `__init__` otherwise. The parsing and the drawing are `scripts/house.py`'s, which prints the house.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import embodied

ROOT = Path(embodied.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"


def _house():
    spec = importlib.util.spec_from_file_location("house", ROOT.parent / "scripts" / "house.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


house = _house()


def test_no_import_cycles():
    found = house.cycles(house.graph(ROOT)[0])
    assert not found, "import cycles (modules that import each other, directly or not):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_no_private_imports():
    private = house.graph(ROOT)[2]
    assert not private, "imports of another module's private name:\n" + "\n".join(private)


def test_imports_point_down_the_layers():
    edges, lines, _ = house.graph(ROOT)
    modules = house.module_names(ROOT)
    up = house.upward(edges, house.read_layers(DOC), modules)
    assert not up, "imports that point up the layer order of docs/architecture.md:\n" + "\n".join(
        f"{modules[a].relative_to(ROOT.parent)}:{lines[a, b]}: {a} -> {b}" for a, b in up
    )


def test_no_loops_between_rooms():
    modules = house.module_names(ROOT)
    loops = house.cycles(house.room_graph(house.graph(ROOT)[0], modules))
    assert not loops, "packages that import each other, directly or not:\n" + "\n".join(map(str, loops))


def test_the_checker_sees_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert house.cycles(edges) == [["a", "b", "c"]]


def test_the_checker_sees_an_upward_import_inside_a_function(tmp_path):
    pkg = tmp_path / "embodied"
    for folder in ("low", "high"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "a.py").write_text("from embodied.low import b\n")
    (pkg / "low" / "b.py").write_text("def f():\n    from embodied.high import a\n")
    doc = tmp_path / "layers.md"
    doc.write_text("<!-- layers -->\n```\nhigh/   the top\nlow/    the bottom\n```\n<!-- /layers -->\n")
    edges = house.graph(pkg)[0]
    modules = house.module_names(pkg)
    assert house.upward(edges, house.read_layers(doc), modules) == [("embodied.low.b", "embodied.high.a")]
    assert house.cycles(house.room_graph(edges, modules)) == [["high/", "low/"]]
