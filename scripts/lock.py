#!/usr/bin/env python3
"""The locks of the README's environments, and the check of the newest releases against them.

    python3 scripts/lock.py freeze [--venv .venv] [--out locks/main.txt] [--path SITE]
        write the lock of an environment: every installed distribution as `name==version` (the framework
        itself left out), with a header naming the platform, Python and day. `--path` reads one
        site-packages folder only (the layered .venv-lmms: its own packages, not .venv's below it).
    python3 scripts/lock.py check [--venv .venv] [--lock locks/main.txt]
        exit 0 when the environment holds exactly the lock's versions; else name each difference.
    python3 scripts/lock.py newest [--keep] [--pytest-args ...]
        resolve every package to its newest release within pyproject.toml's ranges in a scratch venv (no
        lock), print what moved (old -> new), run the default suite there (the README's test command), and
        rewrite locks/main.txt if it passes. If it fails: the failing tests, then each moved package put
        back to the lock's version alone (no other change) with the failing tests rerun, naming the package
        whose release broke each test. The report goes to locks/newest.json.

Standard library only: it runs with any python3, and reads the venv it is pointed at through that venv's
own pip and python.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from embodied.environment import SELF, canonical, compare, read_lock  # noqa: E402  (stdlib-only module)

MAIN_LOCK = REPO / "locks" / "main.txt"
REPORT = REPO / "locks" / "newest.json"
EXTRAS = "dev"  # the README's test environment: scripts/setup.sh dev


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(cmd, check=True, text=True, **kw)


def frozen(venv: Path, path: str | None = None) -> dict[str, str]:
    """`{name: version}` that `venv`'s pip lists (all of them, pip included; the framework left out)."""
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"]
    if path:
        cmd += ["--path", path]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {canonical(r["name"]): r["version"] for r in rows if canonical(r["name"]) != SELF}


def write_lock(
    pins: dict[str, str], out: Path, venv_python: Path, what: str, path: str | None = None
) -> None:
    py = subprocess.run(
        [
            str(venv_python),
            "-c",
            "import platform,sys; print(platform.python_implementation(), "
            "platform.python_version(), sys.platform, platform.machine())",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    head = [
        f"# Lock of {what}: the exact versions the test suite last passed with.",
        f"# Platform: {py}; written {datetime.date.today().isoformat()} by scripts/lock.py.",
        "# Installed by scripts/setup*.sh and .ci/run as pip constraints (-c); pyproject.toml keeps the",
        "# ranges a wheel install resolves. "
        + (
            "Rewrite it with `python3 scripts/lock.py newest` (README, Tests)."
            if out.resolve() == MAIN_LOCK
            else "Rewrite it, after its tests pass, with `python3 scripts/lock.py freeze --venv "
            f"{venv_python.parent.parent.name}{' --path SITE' if path else ''} --out locks/{out.name}`."
        ),
    ]
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(head + [f"{n}=={v}" for n, v in sorted(pins.items())]) + "\n")
    print(f"lock: wrote {out.relative_to(REPO)} ({len(pins)} packages)")


def moved(old: dict[str, str], new: dict[str, str]) -> dict[str, list]:
    """What changed from the lock `old` to the resolution `new`: `[name, old, new]` rows (None: absent)."""
    names = sorted(set(old) | set(new))
    return {
        "changed": [[n, old[n], new[n]] for n in names if n in old and n in new and old[n] != new[n]],
        "added": [[n, None, new[n]] for n in names if n not in old],
        "removed": [[n, old[n], None] for n in names if n not in new],
    }


def pytest(venv: Path, args: list[str], junit: Path) -> int:
    cmd = [
        str(venv / "bin" / "python"),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        *args,
    ]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=REPO).returncode


def failures(junit: Path) -> list[str]:
    """Node ids (`tests/test_x.py::test_y`) of the failed or errored tests of a JUnit XML report."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            path = case.get("classname", "").replace(".", "/") + ".py"
            out.append(f"{path}::{case.get('name')}")
    return out


def blame(venv: Path, rows: list[list], failed: list[str], work: Path, limit: int) -> dict[str, str]:
    """For each moved package (pyproject's direct dependencies first), put back the lock's version alone
    (`--no-deps`), rerun the failing tests, and restore it: `{test: package old -> new}` for each test that
    passes with that one package put back."""
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps"]
    direct = (REPO / "pyproject.toml").read_text().lower()
    rows = sorted(rows, key=lambda r: (f'"{r[0]}' not in direct.replace("_", "-"), r[0]))
    found: dict[str, str] = {}
    for name, old, new in rows[:limit]:
        left = [t for t in failed if t not in found]
        if not left:
            break
        run([*pip, f"{name}=={old}"])
        junit = work / f"blame_{name}.xml"
        pytest(venv, ["-q", *left], junit)
        fixed = [t for t in left if t not in failures(junit)] if junit.is_file() else []
        for t in fixed:
            found[t] = f"{name} {old} -> {new}"
        run([*pip, f"{name}=={new}"])
    return found


def newest(args) -> int:
    t0 = time.time()
    lock = read_lock(MAIN_LOCK) if MAIN_LOCK.is_file() else {}
    work = Path(tempfile.mkdtemp(prefix="embodied-newest-"))
    venv = work / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", f"{REPO}[{EXTRAS}]"])
    new = frozen(venv)
    change = moved(lock, new)
    report = {"day": datetime.date.today().isoformat(), "lock": str(MAIN_LOCK.relative_to(REPO))} | change
    for kind, rows in change.items():
        for name, old, ver in rows:
            print(f"newest: {kind:8s} {name} {old or '-'} -> {ver or '-'}")
    if not any(change.values()):
        print("newest: nothing moved; the lock holds the newest releases within pyproject.toml's ranges")
    junit = work / "suite.xml"
    code = pytest(venv, list(args.pytest_args), junit)
    failed = failures(junit) if junit.is_file() else []
    report |= {"suite_exit": code, "failed": failed}
    if code == 0:
        write_lock(
            new, MAIN_LOCK, venv / "bin" / "python", "the main environment (.venv: scripts/setup.sh dev)"
        )
        report["lock_rewritten"] = True
    else:
        print(f"newest: the default suite failed ({len(failed)} tests); the lock is left as it was")
        report["blame"] = blame(venv, change["changed"], failed, work, args.blame_limit) if failed else {}
        for test in failed:
            why = report["blame"].get(test, "no single moved package explains it")
            print(f"newest: FAILED {test}: {why}")
        report["lock_rewritten"] = False
    report["seconds"] = round(time.time() - t0)
    report["platform"] = f"{platform.python_version()} {sys.platform}-{platform.machine()}"
    REPORT.write_text(json.dumps(report, indent=1) + "\n")
    kept = "" if args.keep else " (removed)"
    print(f"newest: report {REPORT.relative_to(REPO)}; scratch venv {venv}{kept}")
    if not args.keep:
        subprocess.run(["rm", "-rf", str(work)])
    return 0 if code == 0 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("freeze", help="write the lock of an environment")
    f.add_argument("--venv", type=Path, default=REPO / ".venv")
    f.add_argument("--out", type=Path, default=MAIN_LOCK)
    f.add_argument("--path", help="one site-packages folder only (a layered venv's own packages)")
    f.add_argument("--what", default="the main environment (.venv: scripts/setup.sh dev)")
    c = sub.add_parser("check", help="does an environment hold exactly the lock's versions?")
    c.add_argument("--venv", type=Path, default=REPO / ".venv")
    c.add_argument("--lock", type=Path, default=MAIN_LOCK)
    c.add_argument("--path")
    n = sub.add_parser("newest", help="the newest releases: resolve, test, rewrite the lock if green")
    n.add_argument("--keep", action="store_true", help="keep the scratch venv")
    n.add_argument("--blame-limit", type=int, default=12, help="moved packages to try putting back")
    n.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments (default: none)")
    a = p.parse_args()
    if a.cmd == "freeze":
        write_lock(frozen(a.venv, a.path), a.out, a.venv / "bin" / "python", a.what, a.path)
        return 0
    if a.cmd == "check":
        status = compare(read_lock(a.lock), frozen(a.venv, a.path))
        for line in status["differs"] + [f"{u} (not in the lock)" for u in status["unlocked"]]:
            print(f"lock: {line}")
        print(f"lock: {a.venv} {'matches' if status['matched'] else 'does NOT match'} {a.lock}")
        return 0 if status["matched"] else 1
    return newest(a)


if __name__ == "__main__":
    sys.exit(main())
