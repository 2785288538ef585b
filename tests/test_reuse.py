"""Experiment rows are reused only when the settings and what produced them (version, code, base weights,
library versions) match: `embodied.experiments.reuse`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import embodied
from embodied.experiments.reuse import (
    code_hash,
    folder_weights_hash,
    provenance,
    reuse_or_run,
    run_jobs,
    source_hash,
    stack_versions,
    weights_hash,
)
from embodied.policy.model import PolicyConfig, load_policy, save_policy
from embodied.policy.tiny import SHIPPED, TinySpec


class Counter:
    """A `compute` that counts its calls and returns a new row each time."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict:
        self.calls += 1
        return {"call": self.calls}


def test_a_changed_base_recomputes_the_row(tmp_path: Path, capsys):
    """Save a tiny policy folder, compute a row from it, change one weight: the row is recomputed; the same
    weights (rewritten, or copied elsewhere) reuse it."""
    model, processor = load_policy(SHIPPED)
    base = tmp_path / "base"
    save_policy(model, processor, base)
    row, compute, key = tmp_path / "exp" / "result.json", Counter(), {"seed": 0}

    assert reuse_or_run(row, key, compute, "job", str(base)) == {"call": 1}
    assert reuse_or_run(row, key, compute, "job", str(base)) == {"call": 1}  # same weights: reused
    assert "[job] reusing" in capsys.readouterr().out

    save_policy(model, processor, base)  # the same weights written again (new file, new mtime)
    assert reuse_or_run(row, key, compute, "job", str(base)) == {"call": 1}
    copy = tmp_path / "copy"
    save_policy(model, processor, copy)  # the hash is of the weights, not of where they are
    assert reuse_or_run(row, key, compute, "job", str(copy)) == {"call": 1}
    capsys.readouterr()

    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1.0  # one changed weight
    save_policy(model, processor, base)
    assert reuse_or_run(row, key, compute, "job", str(base)) == {"call": 2}
    out = capsys.readouterr().out
    assert "[job] not reusing" in out and "weights changed" in out
    assert "code" not in out.split("not reusing")[1] and "version" not in out.split("not reusing")[1]
    assert reuse_or_run(row, key, compute, "job", str(base)) == {"call": 2}  # and that row is reused
    assert compute.calls == 2


def test_changed_code_or_version_recomputes_and_says_which(tmp_path: Path, capsys):
    row, compute = tmp_path / "result.json", Counter()
    reuse_or_run(row, {"a": 1}, compute, "r", "tiny")
    saved = json.loads(row.read_text())
    assert saved["key"]["provenance"] == {
        "version": embodied.__version__,
        "code": code_hash(),
        "weights": f"tiny:{TinySpec(seed=0).key()}",
        "stack": stack_versions(),
    }
    assert stack_versions().startswith(f"torch {torch.__version__.split('+')[0]}, transformers ")
    # another install (a torch or transformers release) recomputes too
    for part, line in (("code", "code changed"), ("version", "version changed"), ("stack", "stack changed")):
        stale = json.loads(row.read_text())
        stale["key"]["provenance"][part] = "something else"
        row.write_text(json.dumps(stale))
        capsys.readouterr()
        reuse_or_run(row, {"a": 1}, compute, "r", "tiny")
        out = capsys.readouterr().out
        assert f"not reusing {row}: {line} since it was saved" in out, out
    # a row saved before provenance was kept is recomputed once, saying so
    stale = json.loads(row.read_text())
    del stale["key"]["provenance"]
    row.write_text(json.dumps(stale))
    reuse_or_run(row, {"a": 1}, compute, "r", "tiny")
    assert "it records no provenance" in capsys.readouterr().out
    assert compute.calls == 5
    # different settings recompute without a provenance line
    reuse_or_run(row, {"a": 2}, compute, "r", "tiny")
    assert "not reusing" not in capsys.readouterr().out and compute.calls == 6
    with pytest.raises(ValueError, match="reserved"):
        reuse_or_run(row, {"provenance": 1}, compute, "r")


def test_policy_paths_resolve_as_policy_path_does(tmp_path: Path):
    # tiny is built from a seed: its spec is hashed and nothing is built
    assert weights_hash("tiny", 0) == f"tiny:{TinySpec(seed=0).key()}"
    assert provenance(PolicyConfig(path="tiny", tiny_seed=1))["weights"] != provenance("tiny")["weights"]
    # tiny-base is the shipped folder
    assert provenance(PolicyConfig())["weights"] == folder_weights_hash(SHIPPED)
    assert "weights" not in provenance(None)  # a row that starts from no policy
    with pytest.raises(FileNotFoundError):
        provenance(str(tmp_path / "nowhere"))


def test_the_code_hash_is_the_python_source_only(tmp_path: Path):
    """A tree laid out like the repository: editing docs (or any non-.py file) leaves the hash alone;
    editing, adding or renaming a .py file changes it."""
    pkg, docs = tmp_path / "embodied", tmp_path / "docs"
    (pkg / "rl").mkdir(parents=True)
    docs.mkdir()
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / "rl" / "rewards.py").write_text("def f():\n    return 1\n")
    (pkg / "README.md").write_text("notes\n")
    (docs / "training.md").write_text("# training\n")
    before = source_hash(pkg)
    (docs / "training.md").write_text("# training, edited\n")
    (pkg / "README.md").write_text("notes, edited\n")
    (pkg / "rl" / "scene.xml").write_text("<mujoco/>\n")
    assert source_hash(pkg) == before
    (pkg / "rl" / "rewards.py").write_text("def f():\n    return 2\n")
    assert source_hash(pkg) != before
    (pkg / "rl" / "rewards.py").write_text("def f():\n    return 1\n")
    assert source_hash(pkg) == before
    (pkg / "rl" / "rewards.py").rename(pkg / "rl" / "losses.py")
    assert source_hash(pkg) != before
    assert code_hash() == code_hash() and len(code_hash()) == 16  # computed once per process


def _mark(folder: str, name: str, need: str | None, seconds: float) -> tuple[str, bool]:
    """A job for `run_jobs`: whether its need's mark was there when it started; then it leaves its own."""
    ready = need is None or (Path(folder) / need).exists()
    time.sleep(seconds)
    (Path(folder) / name).write_text("done")
    return name, ready


def test_run_jobs_starts_a_job_only_after_its_need(tmp_path: Path):
    d = str(tmp_path)
    # "slow" holds a worker; "quick" finishes first, so "after_quick" may start before "slow" ends, and
    # "after_slow", listed before it, must still wait for "slow"
    jobs = [
        (d, "slow", None, 1.5),
        (d, "quick", None, 0.1),
        (d, "after_slow", "slow", 0),
        (d, "after_quick", "quick", 0),
    ]
    needs = [None, None, 0, 1]
    out = run_jobs(_mark, jobs, 2, needs=needs)
    assert out == [("slow", True), ("quick", True), ("after_slow", True), ("after_quick", True)]
    for f in tmp_path.iterdir():
        f.unlink()
    assert run_jobs(_mark, jobs, 1, needs=needs) == out  # in order, here
    with pytest.raises(ValueError, match="earlier job"):
        run_jobs(_mark, jobs, 2, needs=[None, None, 3, 1])


def test_start_and_arm_jobs_list_starts_first_and_tie_each_arm_to_its_seed():
    from embodied.experiments.reuse import start_and_arm_jobs

    jobs, needs = start_and_arm_jobs([3, 5], ["long", "short"], "start")
    assert jobs == [(3, "start"), (5, "start"), (3, "long"), (5, "long"), (3, "short"), (5, "short")]
    assert needs == [None, None, 0, 1, 0, 1]
    assert start_and_arm_jobs([0], ["a"]) == (
        [(0, None), (0, "a")],
        [None, 0],
    )  # recipes: None marks the start
