#!/usr/bin/env bash
# The device plan of issue 53, one call per invocation (docs/scaling.md, "The device plan"):
#
#   call1: `embodied bench step` of random:qwen2.5-vl-3b in bf16 with configs/qwen2_5_vl_3b.yaml's
#          training settings: SFT and GRPO (rollout with generate, scoring, update), 1 warm-up + 3 timed
#          steps each. Carry: runs/device/wheels/call1.
#   extra: only where call 1's preflight reports no torchvision: installs it (carry runs/device/wheels/extra),
#          then call 1 runs again on the same warm machine.
#   call2: the same workload's GRPO through TRL's GRPOTrainer beside ours on the same images (the ratio of
#          one run). Carry: runs/device/wheels/call2; needs call 1's installs (runs/device/site) on the
#          same warm machine: start it at once after call 1.
#
# Each call first runs scripts/device/preflight.py (installs the carried wheels the image lacks, checks
# every import and the GPU, fails in seconds with one message), then the bench under `timeout` so that it
# ends within 9 minutes. Frames are noise of the config's shape (bench.step_clips=noise): no offscreen
# OpenGL needed, and a step's cost depends on shapes only.
#
# What each call writes under $OUT (at most 8 files, none in folders):
#   preflight_CALL.json   python, versions of what it imports, GPU name, wheels installed
#   CALL.log              the bench's output
#   bench_step_CALL.json  the result (bench_step_partial.json's content if the bench was cut off)
#   nvidia_smi_CALL.txt   the GPU as nvidia-smi saw it after the run (device only)
#
# Usage, on the device (device tool `run`, carry [runs/device/wheels/call1], timeout_s 560):
#   bash scripts/device/plan.sh call1
# The rehearsal here, at tiny size on the CPU (tests/test_device_plan.py, -m slow):
#   bash scripts/device/plan.sh call1 --cpu && bash scripts/device/plan.sh call2 --cpu
set -uo pipefail
cd "$(dirname "$0")/../.."
call=${1:?usage: plan.sh call1|call2|extra [--cpu]}
cpu=${2:-}
case "$call" in call1 | call2 | extra) ;; *) echo "plan.sh: unknown call $call (call1, call2 or extra)" >&2; exit 2 ;; esac
if [ "$cpu" = "--cpu" ]; then
  PY=${PYTHON:-.venv/bin/python}
  OUT=${OUT:-runs/device/out-cpu}
else
  PY=${PYTHON:-python3}
  OUT=${OUT:?plan.sh: OUT is not set (the device tool sets it; give OUT=DIR to run elsewhere)}
fi
mkdir -p "$OUT"
SITE=${DEVICE_SITE:-$PWD/runs/device/site}
export DEVICE_SITE=$SITE PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" MUJOCO_GL=${MUJOCO_GL:-egl}
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

t0=$(date +%s)
# shellcheck disable=SC2086
"$PY" scripts/device/preflight.py "$call" $cpu --out "$OUT/preflight_$call.json" || exit 3
echo "plan.sh: preflight took $(($(date +%s) - t0)) s"
[ "$call" = extra ] && exit 0  # it only installs torchvision (scripts/device/fetch_wheels.sh)

if [ "$cpu" = "--cpu" ]; then  # the same bench at the tiny size: seconds, not minutes
  ARGS=(policy.path=tiny-base threads=1 sft.batch_size=4 grpo.prompts_per_step=2 grpo.group_size=4
    grpo.max_new_tokens=16 bench.steps=2 bench.warmup=1)
  LIMIT=${LIMIT:-240}
else
  ARGS=(-c configs/qwen2_5_vl_3b.yaml policy.path=random:qwen2.5-vl-3b threads=8 bench.steps=3 bench.warmup=1)
  LIMIT=${LIMIT:-480}  # 8 minutes: with the preflight and the copies the call ends inside 9
fi
PHASES='[sft,grpo]'
[ "$call" = call2 ] && PHASES='[trl]'
RUN=runs/device/$call$cpu
rm -rf "$RUN"
timeout --kill-after=15 "$LIMIT" "$PY" -m embodied.cli bench step "${ARGS[@]}" bench.step_clips=noise \
  "bench.step_phases=$PHASES" "run_dir=$RUN" -q >"$OUT/$call.log" 2>&1
rc=$?
if [ -f "$RUN/bench_step.json" ]; then
  cp "$RUN/bench_step.json" "$OUT/bench_step_$call.json"
elif [ -f "$RUN/bench_step_partial.json" ]; then
  cp "$RUN/bench_step_partial.json" "$OUT/bench_step_$call.json"
fi
command -v nvidia-smi >/dev/null && [ "$cpu" != "--cpu" ] && nvidia-smi >"$OUT/nvidia_smi_$call.txt" 2>&1
tail -5 "$OUT/$call.log"
echo "plan.sh: $call exit $rc after $(($(date +%s) - t0)) s; results in $OUT"
exit $rc
