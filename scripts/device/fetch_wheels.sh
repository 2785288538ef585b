#!/usr/bin/env bash
# Fetch here the wheels the device image lacks, for the calls of scripts/device/plan.sh, into
# runs/device/wheels/{call1,call2,extra} (runs/ is git-ignored, so they travel only when named in the device
# tool's `carry`), and check that each set fits the 64 MiB a call may take together with the working tree.
#
# The device image (read 2026-11-17): Python 3.12, torch 2.11, transformers (5.17 when last read),
# accelerate, peft, opencv, JAX with CUDA; no MuJoCo, TRL, Warp or vLLM. What embodied imports besides:
# omegaconf (config), mujoco (embodied.envs and embodied.worlds load at import), torchvision (Qwen-VL's
# video processor) and transformers >= 5.20 (mm_token_type_ids). TRL needs datasets, which needs pyarrow
# and pandas.
#
#   call1 (bench step: SFT + GRPO): mujoco, mujoco-core, omegaconf, transformers 5.24 with the versions it
#          checks at import (huggingface-hub, tokenizers, safetensors, regex), and pandas (for call 2).
#   call2 (the TRL ratio, then GPU physics): trl, datasets, pyarrow 15 (the smallest datasets takes), dill,
#          multiprocess, xxhash; for MJX on the image's JAX, mujoco-mjx 3.17 (pure python; its test data,
#          6.3 of its 6.9 MiB, is stripped here) and trimesh (mjx imports it; scipy comes with JAX). Call 1's
#          installs (mujoco among them) must still be on the machine (a warm machine keeps ignored files
#          between calls): plan.sh call2 checks and says so.
#   extra: torchvision 0.26 (torch 2.11's pair), only if the image lacks it: call 1's preflight says so,
#          and `plan.sh extra` installs it in a call of its own (it does not fit beside call 1's set).
#
# Usage: scripts/device/fetch_wheels.sh            (from the repository root; pip must reach an index)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PYTHON:-.venv/bin/python}
DEST=runs/device/wheels
LIMIT=$((64 * 1024 * 1024))
CALL1=(
  "mujoco==4.0.0" "mujoco-core==4.0.0" "omegaconf==2.4.0" "transformers==5.24.0" "huggingface-hub==2.4.0"
  "tokenizers==0.23.3" "safetensors==0.8.0" "regex==2026.11.19" "pandas==3.1.1"
)
EXTRA=("torchvision==0.26.0")
CALL2=("trl==1.16.0" "datasets==5.2.0" "pyarrow==15.0.2" "dill==0.4.1" "multiprocess==0.70.19" "xxhash==3.6.0"
  "mujoco-mjx==3.17.0" "trimesh==5.2.0")
PLATFORM=(--python-version 3.12 --implementation cp --only-binary=:all:
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64)

fetch() {  # fetch DIR SPEC...
  local dir=$1; shift
  mkdir -p "$dir"
  "$PY" -m pip download --quiet --no-deps "${PLATFORM[@]}" -d "$dir" "$@"
}
fetch "$DEST/call1" "${CALL1[@]}"
fetch "$DEST/call2" "${CALL2[@]}"
fetch "$DEST/extra" "${EXTRA[@]}"

# mujoco-mjx ships MJX's test scenes and tests (meshes, textures): drop them and their RECORD lines, so that
# the wheel is 0.6 MiB instead of 6.9 (the preflight unpacks it as a zip; nothing at run time reads them).
"$PY" - "$DEST"/call2/mujoco_mjx-*.whl <<'EOF'
import sys, zipfile
from pathlib import Path

path = Path(sys.argv[1])
def dropped(name):
    return "/test_data/" in name or name.endswith("_test.py")
with zipfile.ZipFile(path) as z:
    if not any(dropped(n) for n in z.namelist()):
        sys.exit(0)  # stripped already
    items = [(i, z.read(i)) for i in z.infolist() if not dropped(i.filename)]
tmp = path.with_suffix(".tmp")
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
    for info, data in items:
        if info.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines if not dropped(line.split(",")[0])).encode()
        out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
tmp.replace(path)
EOF

# what travels besides the carry: tracked and untracked-not-ignored files (a tracked file deleted in the
# working tree has no size: stat skips it)
tree=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true; } |
  awk '{s += $1} END {print s + 0}')
status=0
for call in call1 call2 extra; do
  wheels=$(du -cb "$DEST/$call"/*.whl | tail -1 | cut -f1)
  total=$((tree + wheels))
  awk -v c="$call" -v w="$wheels" -v t="$tree" 'BEGIN {
    m = 1048576; printf "%s: wheels %.1f MiB + working tree %.1f MiB = %.1f MiB of 64 MiB\n", c, w / m, t / m, (w + t) / m }'
  ls -1 "$DEST/$call"
  if [ "$total" -gt "$LIMIT" ]; then
    echo "error: $call's carry is over 64 MiB" >&2
    status=1
  fi
done
exit $status
