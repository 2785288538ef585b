"""Size rules of the house (issue 61): no function over 80 lines, and the GRPO step's module within ~450
lines (what used to be woven into it, PPO's critic, the runner, PAPO's gauges, has modules of its own)."""

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


def test_grpo_step_module_stays_small():
    lines = len((ROOT / "train" / "grpo.py").read_text().splitlines())
    assert lines <= 460, lines
