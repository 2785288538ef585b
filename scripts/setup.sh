#!/usr/bin/env bash
# Installs embodied into ./.venv (created if missing), with headless-rendering system libraries.
# Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh dev
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"

# MuJoCo renders offscreen through EGL (Mesa on CPU machines). Install the libraries if missing.
if ! ldconfig -p 2>/dev/null | grep -q "libEGL_mesa.so.0"; then
  pkgs="libegl1 libegl-mesa0 libgl1-mesa-dri"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing $pkgs for headless rendering"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null
  else
    echo "setup: warning: EGL libraries not found; install them with: sudo apt-get install -y $pkgs" >&2
  fi
fi

# The dev extra's report test opens report.html in headless Chromium (Debian's chromium, driven through
# chromium-driver); without them that test skips.
if [[ ",$extras," == *",dev,"* ]] && ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing chromium and chromium-driver for the report's browser test"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } ||
      echo "setup: warning: could not install chromium; the browser test of report.html will skip" >&2
  else
    echo "setup: note: no chromedriver; the browser test of report.html will skip (apt-get install chromium chromium-driver)" >&2
  fi
fi

python_bin="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv

# The lock (locks/main.txt) holds the exact versions the suite last passed with, on Linux x86_64 and
# CPython 3.11: installed as pip constraints, so a fresh machine on any day gets them. EMBODIED_UNLOCKED=1
# resolves pyproject.toml's ranges instead (the newest releases; `python3 scripts/lock.py newest` checks
# them on purpose). On another platform the lock does not apply and the ranges are used, with a warning.
lock=(-c locks/main.txt)
here=$(.venv/bin/python -c 'import platform, sys; print(f"{sys.platform}-{platform.machine()}-{sys.version_info[0]}.{sys.version_info[1]}")')
if [ "${EMBODIED_UNLOCKED:-0}" = 1 ]; then
  lock=(); echo "setup: EMBODIED_UNLOCKED=1: installing the newest releases within pyproject.toml's ranges"
elif [ "$here" != "linux-x86_64-3.11" ]; then
  lock=(); echo "setup: warning: locks/main.txt is for linux-x86_64-3.11, this is $here: installing pyproject.toml's ranges" >&2
fi
# unlocked, an existing .venv moves to the newest releases too (installed packages would count as satisfied)
[ ${#lock[@]} -gt 0 ] || lock=(--upgrade --upgrade-strategy eager)
pip=(.venv/bin/python -m pip install -q "${lock[@]}")
"${pip[@]}" --upgrade pip
if [ -n "$extras" ]; then
  "${pip[@]}" -e ".[$extras]"
else
  "${pip[@]}" -e .
fi
if [ "${lock[0]}" = -c ] && ! check=$(.venv/bin/python scripts/lock.py check --venv .venv 2>&1); then
  # packages a locked install did not ask for: left in an older .venv, or installed by hand
  echo "setup: .venv holds versions outside locks/main.txt:" >&2; echo "$check" >&2
  if [ -n "${CI:-}" ]; then echo "setup: CI installs the lock exactly; failing" >&2; exit 1; fi
fi
echo "setup: done ($(.venv/bin/python -c 'import embodied.environment as e; print("embodied", e.describe()["embodied"]["version"] + ";", e.summary_line())'))"
