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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from embodied.environment import SELF, canonical, compare, public, read_lock  # noqa: E402  (stdlib only)

MAIN_LOCK = REPO / "locks" / "main.txt"
REPORT = REPO / "locks" / "newest.json"
EXTRAS = "dev"  # the README's test environment: scripts/setup.sh dev
PLATFORM = "linux-x86_64-3.11"  # what the locks are for (scripts/setup*.sh apply them only there)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(cmd, check=True, text=True, **kw)


def frozen(venv: Path, path: str | None = None) -> dict[str, str]:
    """`{name: version}` that `venv`'s pip lists (all of them, pip included; the framework left out)."""
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"]
    if path:
        cmd += ["--path", path]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    # a local label (`+cpu`, a build from this machine's wheel folder) is no registry's version: left out
    return {canonical(r["name"]): public(r["version"]) for r in rows if canonical(r["name"]) != SELF}


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
    print(f"lock: wrote {out} ({len(pins)} packages)")


def moved(old: dict[str, str], new: dict[str, str]) -> dict[str, list]:
    """What changed from the lock `old` to the resolution `new`: `[name, old, new]` rows (None: absent)."""
    names = sorted(set(old) | set(new))
    return {
        "changed": [[n, old[n], new[n]] for n in names if n in old and n in new and old[n] != new[n]],
        "added": [[n, None, new[n]] for n in names if n not in old],
        "removed": [[n, old[n], None] for n in names if n not in new],
    }


def pytest(venv: Path, args: list[str], cache: Path) -> tuple[int, list[str]]:
    """Run pytest with `venv`'s Python in the repository: its exit code and the node ids it failed or errored
    on (pytest's own `lastfailed` record in `cache`: collection errors and parametrized ids included)."""
    cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-o", f"cache_dir={cache}", *args]
    print("+", " ".join(cmd), flush=True)
    code = subprocess.run(cmd, cwd=REPO).returncode
    last = cache / "v" / "cache" / "lastfailed"
    return code, sorted(json.loads(last.read_text())) if last.is_file() else []


def blame(venv: Path, rows: list[list], failed: list[str], work: Path, limit: int) -> dict[str, str]:
    """Which moved package broke each failing test. First the failing tests run again unchanged: those that
    pass now are `flaky`, not blamed. Then each moved package (pyproject's direct dependencies first) is put
    back to the lock's version alone (`--no-deps`), the tests still unexplained rerun, and the package
    restored: `{test: "package old -> new"}` for each test that passes with that one package put back (a
    rerun that fails to run, exit code above 1, explains nothing). A release that breaks only together with
    a moved dependency of its own (transformers with tokenizers) stays unexplained: "no single package"."""
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps"]
    direct = (REPO / "pyproject.toml").read_text().lower().replace("_", "-")
    rows = sorted(rows, key=lambda r: (f'"{r[0]}' not in direct, r[0]))
    found: dict[str, str] = {}

    def rerun(tag: str, tests: list[str]) -> list[str]:
        code, still = pytest(venv, ["-q", *tests], work / f"cache_{tag}")
        return [t for t in tests if t not in still] if code in (0, 1) else []

    for t in rerun("again", failed):
        found[t] = "flaky: passed when run again unchanged"
    for name, old, new in rows[:limit]:
        left = [t for t in failed if t not in found]
        if not left:
            break
        try:
            run([*pip, f"{name}=={old}"])
            fixed = rerun(name, left)
        except subprocess.CalledProcessError:
            fixed = []  # the lock's version no longer installs here: it cannot be tried
        for t in fixed:
            found[t] = f"{name} {old} -> {new}"
        run([*pip, f"{name}=={new}"])
    return found


def scratch_install(venv: Path) -> None:
    """A fresh venv with the newest releases within pyproject.toml's ranges (no lock)."""
    run([sys.executable, "-m", "venv", str(venv)])
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", f"{REPO}[{EXTRAS}]"])


def newest(args) -> int:
    here = f"{sys.platform}-{platform.machine()}-{sys.version_info[0]}.{sys.version_info[1]}"
    if here != PLATFORM:
        print(
            f"newest: the lock is for {PLATFORM} and this Python is {here}: run it with CPython 3.11 on Linux"
        )
        return 2
    t0, lock = time.time(), read_lock(MAIN_LOCK) if MAIN_LOCK.is_file() else {}
    work = Path(tempfile.mkdtemp(prefix="embodied-newest-"))
    venv = work / "venv"
    pip_config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    report: dict = {"day": datetime.date.today().isoformat(), "lock": str(MAIN_LOCK.relative_to(REPO))}
    report |= {"platform": here, "pip_config": pip_config.stdout.splitlines()}  # e.g. a machine's torch cap
    try:
        code = _newest(args, lock, venv, work, report)
    except subprocess.CalledProcessError as e:
        print(
            f"newest: `{' '.join(map(str, e.cmd))}` failed (exit {e.returncode}); the lock is left as it was"
        )
        report |= {"install_failed": " ".join(map(str, e.cmd)), "lock_rewritten": False}
        code = 2
    finally:
        report["seconds"] = round(time.time() - t0)
        REPORT.write_text(json.dumps(report, indent=1) + "\n")
        kept = "" if args.keep else " (removed)"
        print(f"newest: report {REPORT.relative_to(REPO)}; scratch venv {venv}{kept}")
        if not args.keep:
            subprocess.run(["rm", "-rf", str(work)])
    return code


def _newest(args, lock: dict[str, str], venv: Path, work: Path, report: dict) -> int:
    scratch_install(venv)
    new = frozen(venv)
    change = moved(lock, new)
    report |= change
    for kind, rows in change.items():
        for name, old, ver in rows:
            print(f"newest: {kind:8s} {name} {old or '-'} -> {ver or '-'}")
    if not any(change.values()):
        print("newest: nothing moved; the lock holds the newest releases within pyproject.toml's ranges")
    code, failed = pytest(venv, list(args.pytest_args), work / "cache_suite")
    report |= {"suite_exit": code, "failed": failed, "pytest_args": list(args.pytest_args)}
    rewrite = code == 0 and not args.pytest_args and any(change.values())
    if rewrite:
        write_lock(
            new, MAIN_LOCK, venv / "bin" / "python", "the main environment (.venv: scripts/setup.sh dev)"
        )
    elif code == 0 and not args.pytest_args:
        print("newest: green, and the lock already holds these versions: left as it was (its sha256 too)")
    elif code == 0:
        print("newest: green, but on a narrowed suite (pytest arguments given): the lock is left as it was")
    else:
        print(f"newest: the default suite failed ({len(failed)} tests); the lock is left as it was")
        report["blame"] = blame(venv, change["changed"], failed, work, args.blame_limit) if failed else {}
        for test in failed:
            print(
                f"newest: FAILED {test}: {report['blame'].get(test, 'no single moved package explains it')}"
            )
    report["lock_rewritten"] = rewrite
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
