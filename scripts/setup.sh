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
.venv/bin/python -m pip install -q --upgrade pip
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install -q -e ".[$extras]"
else
  .venv/bin/python -m pip install -q -e .
fi
echo "setup: done ($(.venv/bin/python -c 'import embodied, torch, transformers, mujoco; print("embodied", embodied.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "mujoco", mujoco.__version__)'))"
