"""The software environment a result was made in: package versions, the framework's commit, and whether the
installed packages are the ones the lock holds.

Every result JSON the commands write (run summaries, eval results, bench and experiment JSON) carries
`describe()` under `"environment"`, so a number quoted from it names what produced it. The lock is the
repository's `locks/main.txt` (pip constraints: `name==version` lines, written by `scripts/lock.py`); a wheel
install has no repository and records `lock.file: null`.

Reading the versions walks the installed distributions once (~0.1 s) and is cached per process; nothing here
imports torch or any other heavy package.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import embodied

REPO = Path(embodied.__file__).resolve().parent.parent
LOCK = REPO / "locks" / "main.txt"
NAMED = (
    "torch",
    "torchvision",
    "transformers",
    "tokenizers",
    "peft",
    "accelerate",
    "mujoco",
    "huggingface-hub",
)
"""The packages a result names by version (what moves its numbers); `lock.differs` lists any other."""
SELF = "embodied"


def canonical(name: str) -> str:
    """A distribution name as the registry compares them (PEP 503): lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """`{name: version}` of a constraints file's `name==version` lines (comments and blanks skipped); a line
    of any other form is refused, naming the file and the line."""
    pins = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if m is None:
            raise ValueError(
                f"{path}:{n}: {raw!r} is not a `name==version` pin; rewrite the lock with scripts/lock.py"
            )
        pins[canonical(m.group(1))] = m.group(2)
    return pins


def installed() -> dict[str, str]:
    """`{name: version}` of every distribution this interpreter imports from (the framework excluded)."""
    out = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and canonical(name) != SELF:
            out.setdefault(canonical(name), dist.version)  # the first on sys.path wins, as imports do
    return out


def public(version: str) -> str:
    """A version without its local label (`2.13.0+cpu` -> `2.13.0`): the part a registry serves, and what a
    lock pins (`==2.13.0` accepts a local `+cpu` build; `==2.13.0+cpu` accepts nothing a registry has)."""
    return version.split("+", 1)[0]


def compare(pins: dict[str, str], have: dict[str, str]) -> dict:
    """How installed versions `have` stand against the lock's `pins`: `matched` when every installed package
    is pinned at its installed version (a pinned package left uninstalled is fine: an extra not asked for)."""
    off = {n: v for n, v in have.items() if n in pins and public(pins[n]) != public(v)}
    differs = [f"{n} {v} (lock {pins[n]})" for n, v in sorted(off.items())]
    unlocked = [f"{n} {v}" for n, v in sorted(have.items()) if n not in pins]
    return {"matched": not differs and not unlocked, "differs": differs, "unlocked": unlocked}


def lock_status(path: Path = LOCK, have: dict[str, str] | None = None) -> dict:
    """The lock `path` against this interpreter's packages (see `compare`); `file: null` without one."""
    if not path.is_file():
        return {"file": None, "matched": False, "why": f"no {path} (a wheel install has no lock)"}
    text = path.read_bytes()
    status = compare(read_lock(path), installed() if have is None else have)
    return {"file": str(path.relative_to(REPO)), "sha256": hashlib.sha256(text).hexdigest()[:16]} | status


def commit() -> dict:
    """The framework's git commit and whether the work tree differs from it (`None` outside a checkout)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    if not (REPO / ".git").exists() or not (REPO / "pyproject.toml").is_file():
        # a wheel install: a venv inside a checkout (site-packages under it) is not the checkout
        return {"commit": None, "dirty": None}
    try:
        head = git("rev-parse", "HEAD")
        paths = ("embodied", "sim", "pyproject.toml")  # the code a result depends on (untracked plugins too)
        dirty = bool(git("status", "--porcelain", "--untracked-files=normal", "--", *paths))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": dirty}


@functools.lru_cache(maxsize=1)
def describe() -> dict:
    """What `"environment"` holds in every result JSON: Python, platform, the framework's version and commit,
    the versions of `NAMED` (null when not installed), and the lock's status (`lock_status`)."""
    have = installed()
    return {
        "embodied": {"version": embodied.__version__, **commit()},
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "packages": {name: have.get(name) for name in NAMED},
        "lock": lock_status(LOCK, have),
    }


def stamped(result: dict) -> dict:
    """`result` with `"environment"` (`describe()`) added: what every written result JSON goes through."""
    return result | {"environment": describe()}


def summary_line(env: dict | None = None) -> str:
    """One line for a terminal: the named versions and whether they are the lock's."""
    env = env or describe()
    lock = env["lock"]
    off = (lock.get("differs") or []) + (lock.get("unlocked") or [])
    where = (
        "the lock's versions"
        if lock["matched"]
        else f"NOT the lock's ({lock.get('why') or ', '.join(off[:6])})"
    )
    named = ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v)
    return f"{named}; {where}"


# `python -m embodied.environment`: what a result would record; exit 1 off the lock
if __name__ == "__main__":
    import json

    env = describe()
    print(json.dumps(env, indent=2))
    sys.exit(0 if env["lock"]["matched"] else 1)
