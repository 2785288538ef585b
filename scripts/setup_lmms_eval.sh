#!/usr/bin/env bash
# Makes ./.venv-lmms: lmms-eval 0.7.3 layered on the framework's own .venv, without touching it.
#
# Why apart: lmms-eval 0.7.3 pins av<16 and wandb==0.25.0 (this framework's .venv has av 18 and wandb
# 0.31), so installing it into .venv would downgrade both under everything else. Why layered: lmms-eval's
# hooks import `embodied` (torch, transformers, mujoco), and a second environment with its own torch is a
# second multi-GB download. So .venv-lmms is a plain venv of the same Python whose site-packages ends with a
# .pth line that adds .venv's site-packages (and the .pth files there: the editable `embodied`) AFTER its
# own. pip in .venv-lmms sees .venv's packages as installed (torch is never fetched) and puts whatever
# lmms-eval needs in another version (av 15, wandb 0.25, ...) into .venv-lmms, where it wins; it never
# uninstalls anything from .venv (pip leaves packages outside its environment alone).
#
# Usage: scripts/setup_lmms_eval.sh     (after scripts/setup.sh dev; then .venv/bin/python -m pytest -m lmms_eval)
# Env:   LMMS_SPEC='lmms-eval==0.7.3'
set -euo pipefail
cd "$(dirname "$0")/.."

lmms_spec="${LMMS_SPEC:-lmms-eval==0.7.3}"
[ -x .venv/bin/python ] || { echo "setup_lmms_eval: no .venv; run scripts/setup.sh dev first" >&2; exit 1; }
base=$(.venv/bin/python -c "import sys; print(sys._base_executable)")
base_site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")

[ -x .venv-lmms/bin/python ] || "$base" -m venv .venv-lmms
site=$(.venv-lmms/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")
# zz: read after every other .pth of .venv-lmms; addsitedir also runs .venv's own .pth files
echo "import site; site.addsitedir('$base_site')" > "$site/zz_embodied_venv.pth"

# locks/lmms.txt: the exact versions of .venv-lmms's own packages that tests -m lmms_eval last passed with
# (Linux x86_64, CPython 3.11; what it shares comes from .venv, locked by locks/main.txt), as pip
# constraints; EMBODIED_UNLOCKED=1 resolves the ranges instead. Rewrite it with `python3 scripts/lock.py
# freeze --venv .venv-lmms --path "$site" --out locks/lmms.txt` after those tests pass.
lock=(-c locks/lmms.txt)
here=$(.venv-lmms/bin/python -c 'import platform, sys; print(f"{sys.platform}-{platform.machine()}-{sys.version_info[0]}.{sys.version_info[1]}")')
if [ "${EMBODIED_UNLOCKED:-0}" = 1 ] || [ "$here" != "linux-x86_64-3.11" ] || [ ! -f locks/lmms.txt ]; then
  lock=(); echo "setup_lmms_eval: installing without locks/lmms.txt (unlocked, another platform, or no lock yet)"
fi
pip=(.venv-lmms/bin/python -m pip install -q ${lock[@]+"${lock[@]}"})  # bash 3.2 calls an empty array unbound
# filelock<4: lmms-eval 0.7.3's evaluator patches `filelock._api`, which filelock 4 (in .venv) no longer has
"${pip[@]}" "$lmms_spec" "filelock<4"
.venv-lmms/bin/python - <<'EOF'
import sys
from importlib.metadata import version

import torch
import transformers

import embodied.integrations.lmms_eval  # noqa: F401  (the hooks import here)
from lmms_eval.tasks import TaskManager  # noqa: F401

import filelock._api  # noqa: F401  (lmms_eval.evaluator needs it)

here = {m: sys.modules[m].__file__ for m in ("torch", "embodied")}
print(f"setup_lmms_eval: done (lmms-eval {version('lmms_eval')}, torch {torch.__version__} and "
      f"transformers {transformers.__version__} from .venv, av {version('av')}; {here})")
EOF
