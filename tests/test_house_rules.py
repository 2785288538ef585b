"""Size rules of the house: no function over 80 lines.

The other rules that guard what matters live beside what they guard: no Qwen-only code outside
`embodied/policy/architectures/` (`tests/test_architectures.py`) and imports that point down the layers of
docs/architecture.md (`tests/test_imports.py`). A line cap on one module (grpo.py's, issue 61) rewarded
squeezing code into fewer lines over splitting it by idea, and is gone (issue 68)."""

from __future__ import annotations

import ast
from pathlib import Path

import embodied

ROOT = Path(embodied.__file__).parent


def long_functions(limit: int = 80) -> list[str]:
    """`path:function (lines)` for every function or method of `embodied` longer than `limit` lines."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append(f"{path.relative_to(ROOT)}:{node.name} ({lines})")
    return out


def test_no_function_is_over_80_lines():
    assert long_functions() == []


def test_the_checker_sees_a_long_function():
    assert long_functions(limit=30)  # the house has functions of 31-80 lines: a blind checker fails
