#!/usr/bin/env bash
# Makes ./.venv-verl: verl beside (never inside) the framework's own .venv.
#
# verl 0.9.1 pins transformers<5.11 and this framework needs >=5.20, so the two cannot share one
# environment. .venv-verl holds verl with its own transformers, plus `embodied` installed WITHOUT its
# dependencies: verl only imports embodied's reward code (embodied/integrations/verl_reward.py), which needs
# torch, numpy, mujoco and tqdm, never transformers. The tests in tests/test_verl.py (marker `verl`) run
# the export in .venv and verl's own loaders in .venv-verl.
#
# Usage: scripts/setup_verl.sh            (then: .venv/bin/python -m pytest -m verl)
# Env:   PYTHON=python3.11  TORCH_SPEC='torch==2.13.0'  TORCH_INDEX=URL  VERL_SPEC='verl==0.9.1'
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin="${PYTHON:-python3}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
verl_spec="${VERL_SPEC:-verl==0.9.1}"

[ -x .venv-verl/bin/python ] || "$python_bin" -m venv .venv-verl
# locks/verl.txt: the exact versions tests -m verl last passed with (Linux x86_64, CPython 3.11), as pip
# constraints; EMBODIED_UNLOCKED=1 resolves the ranges instead. `scripts/lock.py freeze --venv .venv-verl
# --out locks/verl.txt` rewrites it.
lock=(-c locks/verl.txt)
here=$(.venv-verl/bin/python -c 'import platform, sys; print(f"{sys.platform}-{platform.machine()}-{sys.version_info[0]}.{sys.version_info[1]}")')
if [ "${EMBODIED_UNLOCKED:-0}" = 1 ] || [ "$here" != "linux-x86_64-3.11" ] || [ ! -f locks/verl.txt ]; then
  lock=(); echo "setup_verl: installing without locks/verl.txt (unlocked, another platform, or no lock yet)"
fi
pip=(.venv-verl/bin/python -m pip install -q ${lock[@]+"${lock[@]}"})  # bash 3.2 calls an empty array unbound
"${pip[@]}" --upgrade pip
# torch first, on its own: where a CPU wheel is offered (a local wheel directory, as on the test machines,
# or TORCH_INDEX=https://download.pytorch.org/whl/cpu) pip takes it, and verl then finds torch satisfied
# instead of pulling the default CUDA build (several GB). On a GPU machine leave TORCH_INDEX unset.
if ! .venv-verl/bin/python -c "import torch" 2>/dev/null; then
  "${pip[@]}" "$torch_spec" ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}
fi
"${pip[@]}" "$verl_spec" "$torch_spec"
# what the reward code needs besides torch (see above); pyarrow/datasets come with verl
"${pip[@]}" "mujoco>=3.3" "tqdm>=4.66" "numpy>=1.26"
"${pip[@]}" --no-deps -e .
.venv-verl/bin/python - <<'EOF'
import torch, transformers, verl
from embodied.integrations import verl_reward  # noqa: F401  (the reward entry point imports here)
print(f"setup_verl: done (verl {verl.__version__}, torch {torch.__version__}, transformers {transformers.__version__})")
EOF
