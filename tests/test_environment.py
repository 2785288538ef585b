"""The lock and the environment record (issue 65): parsing a lock, comparing an environment with it, and the
newest-releases check's pieces that need no scratch venv (what moved, which failing tests a JUnit file names).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from embodied.environment import LOCK, REPO, compare, describe, lock_status, read_lock, stamped


def _lock_script():
    spec = importlib.util.spec_from_file_location("lock_script", REPO / "scripts" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_lock_is_read_as_pins_and_a_line_of_another_form_is_refused_naming_it(tmp_path):
    lock = tmp_path / "main.txt"
    lock.write_text("# header\n\nTorch==2.14.1\nhuggingface_hub==2.5.0  # a comment\nnvidia.cublas==13.1\n")
    assert read_lock(lock) == {"torch": "2.14.1", "huggingface-hub": "2.5.0", "nvidia-cublas": "13.1"}
    lock.write_text("torch==2.14.1\ntransformers>=5.20\n")
    with pytest.raises(ValueError, match=r"main.txt:2: 'transformers>=5.20' is not a `name==version` pin"):
        read_lock(lock)


def test_an_environment_matches_only_when_every_installed_package_is_the_locks():
    pins = {"torch": "2.14.1", "transformers": "5.24.0", "pytest": "9.0"}
    # pytest pinned but not installed (a non-dev install): still the lock's environment
    assert compare(pins, {"torch": "2.14.1", "transformers": "5.24.0"}) == {
        "matched": True,
        "differs": [],
        "unlocked": [],
    }
    got = compare(pins, {"torch": "2.14.1", "transformers": "5.25.0", "trl": "1.16.0"})
    assert got == {
        "matched": False,
        "differs": ["transformers 5.25.0 (lock 5.24.0)"],
        "unlocked": ["trl 1.16.0"],
    }


def test_the_record_names_versions_commit_and_the_repositorys_lock():
    env = stamped({"accuracy": 0.5})["environment"]
    assert env is describe()  # read once per process
    assert env["packages"]["torch"] and env["packages"]["transformers"] and env["packages"]["mujoco"]
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert env["embodied"]["commit"] == (head.stdout.strip() or None)  # None outside a checkout
    assert env["lock"]["file"] == "locks/main.txt" and len(env["lock"]["sha256"]) == 16
    assert lock_status(Path("/nonexistent/main.txt"))["file"] is None


def test_the_lock_pins_what_pyproject_asks_for_and_names_its_platform():
    pins = read_lock(LOCK)
    for name in ("torch", "torchvision", "transformers", "peft", "accelerate", "mujoco", "pytest", "pip"):
        assert name in pins, name
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"torch=={pins["torch"]}"' in pyproject  # pyproject pins torch: a lock disagreeing cannot install
    assert "linux x86_64" in LOCK.read_text().splitlines()[1]


def test_newest_names_what_moved_and_reads_the_failed_tests_from_pytest_itself(tmp_path):
    """What moved, old -> new; and the failing node ids as pytest records them: a parametrized id, a method
    of a class and a module that fails to import (a collection error, what a breaking release often is)."""
    lock = _lock_script()
    got = lock.moved({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "2.1", "d": "4"})
    assert got == {"changed": [["b", "2", "2.1"]], "added": [["d", None, "4"]], "removed": [["c", "3", None]]}
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_a.py").write_text(
        "import pytest\n\ndef test_ok():\n    pass\n\n"
        "@pytest.mark.parametrize('x', [1, 2])\ndef test_param(x):\n    assert x == 1\n\n"
        "class TestK:\n    def test_m(self):\n        assert False\n"
    )
    (suite / "test_b.py").write_text("import no_such_module_here  # noqa\n")
    venv = Path(sys.executable).parent.parent
    code, failed = lock.pytest(venv, ["-q", str(suite)], tmp_path / "cache")
    assert code == 2  # a collection error stops the run: exit 2, and it is still named
    # node ids as pytest gives them: relative to its rootdir, which depends on the folders above tmp_path
    assert [f.rsplit("suite/", 1)[-1] for f in failed] == ["test_b.py"], failed
    code, failed = lock.pytest(venv, ["-q", str(suite / "test_a.py")], tmp_path / "cache2")
    got = [f.rsplit("suite/", 1)[-1] for f in failed]
    assert code == 1 and got == ["test_a.py::TestK::test_m", "test_a.py::test_param[2]"], failed


def test_a_local_build_label_is_not_a_difference():
    # this machine's wheel folder holds torch 2.13.0+cpu; a registry serves 2.13.0: the lock pins that
    assert compare({"torch": "2.13.0"}, {"torch": "2.13.0+cpu"})["matched"]
    assert not compare({"torch": "2.13.0"}, {"torch": "2.14.1+cpu"})["matched"]


def test_readme_quotes_the_locks_versions():
    import re

    text = (REPO / "README.md").read_text()
    quoted = text[text.index("Both install the **lock**") :].split("\n\n", 1)[0]
    pins = read_lock(LOCK)
    assert f"every package ({len(pins)})" in quoted
    for name, version in re.findall(r"([a-z][a-z-]+) (\d+\.\d+\.\d+)", quoted):
        assert pins[name] == version, (name, version, pins[name])


def test_lock_check_agrees_with_the_record_for_this_interpreter():
    venv = Path(sys.executable).parent.parent
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "lock.py"), "check", "--venv", str(venv)],
        capture_output=True,
        text=True,
    )
    assert (out.returncode == 0) == describe()["lock"]["matched"], out.stdout
