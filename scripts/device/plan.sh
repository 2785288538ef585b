#!/usr/bin/env bash
# The device plan of issue 53, one call per invocation (docs/scaling.md, "The device plan"):
#
#   call1: `embodied bench step` of random:qwen2.5-vl-3b in bf16 with configs/qwen2_5_vl_3b.yaml's
#          training settings under LoRA rank 16 (the KL reference is the policy with its adapters off, no
#          copy) and the timing reward (a random: policy's text never earns the MCQ reward; with it every
#          advantage is non-zero, so the update is a real one): SFT and GRPO (rollout with generate,
#          scoring, update), 1 warm-up + 3 timed steps each. Carry: runs/device/wheels/call1.
#   extra: only where call 1's preflight reports no torchvision: installs it (carry runs/device/wheels/extra),
#          then call 1 runs again on the same warm machine.
#   call2: the same workload's GRPO through TRL's GRPOTrainer beside ours on the same images (the ratio of
#          one run), under a 170 s `timeout`; then GPU physics, under 150 s: `embodied bench envs` with MJX
#          (env.backend=mjx) on the image's JAX, CPU MuJoCo against batches of 4,096, 256, 16 and 1 worlds
#          (largest first), label parity on place, carry and push (128 answers each). Carry:
#          runs/device/wheels/call2; needs call 1's installs (runs/device/site: mujoco among them) on the
#          same warm machine: start it at once after call 1.
#
# Each call first runs scripts/device/preflight.py (installs the carried wheels the image lacks, checks
# every import and the GPU, fails in seconds with one message), then the bench under `timeout` so that it
# ends within 6 minutes: a start (1-4 minutes) and both calls fit the 15 minutes a lent machine gives. Frames are noise of the config's shape (bench.step_clips=noise): no offscreen
# OpenGL needed, and a step's cost depends on shapes only. Call 2's preflight checks the physics part
# apart (JAX, mujoco.mjx, a GPU that JAX sees): where only that fails (exit 4), TRL's part still runs, the
# physics one is skipped and the call exits 4.
#
# What each call writes under $OUT (at most 8 files, none in folders):
#   preflight_CALL.json   python, versions of what it imports, GPU name, JAX's devices (call 2), wheels
#                         installed
#   CALL.log              the bench's output
#   bench_step_CALL.json  the result (bench_step_partial.json's content if the bench was cut off)
#   physics_call2.log     call 2: `bench envs`' output
#   bench_envs_call2.json call 2: its result (bench_envs_partial.json's, "complete": false, if cut off)
#   nvidia_smi_CALL.txt   the GPU as nvidia-smi saw it after the run (device only)
#
# Usage, on the device (device tool `run`, carry [runs/device/wheels/call1], timeout_s 420):
#   bash scripts/device/plan.sh call1
# The rehearsal here, at tiny size on the CPU (tests/test_device_plan.py, -m slow; call 2's physics needs
# `pip install jax mujoco-mjx` here, and runs push alone at batches 4 and 1):
#   bash scripts/device/plan.sh call1 --cpu && bash scripts/device/plan.sh call2 --cpu
# LIMIT, PHYSICS_LIMIT and PHYSICS_ARGS (dotted overrides) replace a part's time limit or settings.
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
"$PY" scripts/device/preflight.py "$call" $cpu --out "$OUT/preflight_$call.json"
pre=$?
[ "$pre" = 0 ] || [ "$pre" = 4 ] || exit 3  # 4: all but the physics part can run (preflight says why)
echo "plan.sh: preflight took $(($(date +%s) - t0)) s"
[ "$call" = extra ] && exit 0  # it only installs torchvision (scripts/device/fetch_wheels.sh)

if [ "$cpu" = "--cpu" ]; then  # the same bench at the tiny size: seconds, not minutes
  ARGS=(policy.path=tiny-base threads=1 sft.batch_size=4 grpo.prompts_per_step=2 grpo.group_size=4
    grpo.max_new_tokens=16 bench.steps=2 bench.warmup=1 bench.step_reward=timing)
  [ "$call" = call1 ] && ARGS+=(policy.lora_rank=8)
  LIMIT=${LIMIT:-240}
  PHYSICS_LIMIT=${PHYSICS_LIMIT:-240}
  read -ra PHYS <<<"${PHYSICS_ARGS:-env.tasks=[push] bench.env_batches=[4,1] bench.env_episodes=4}"
else
  ARGS=(-c configs/qwen2_5_vl_3b.yaml policy.path=random:qwen2.5-vl-3b threads=8 bench.steps=3 bench.warmup=1
    bench.step_reward=timing)
  [ "$call" = call1 ] && ARGS+=(policy.lora_rank=16)  # call 2 keeps full fine-tuning: TRL's side has no LoRA
  # 5 minutes of bench a call: with the preflight and the copies each call ends inside 6, and a start of
  # up to 4 minutes leaves both inside the 15 a lent machine gives. Call 2 splits them, TRL first (the
  # ratio of the existing plan), then physics (it writes its JSON after every cell).
  if [ "$call" = call2 ]; then LIMIT=${LIMIT:-170}; else LIMIT=${LIMIT:-300}; fi
  PHYSICS_LIMIT=${PHYSICS_LIMIT:-150}
  read -ra PHYS <<<"${PHYSICS_ARGS:-bench.env_batches=[1,16,256,4096] bench.env_episodes=128}"
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
tail -5 "$OUT/$call.log"
echo "plan.sh: $call's bench step exit $rc after $(($(date +%s) - t0)) s"

if [ "$call" = call2 ] && [ "$pre" = 4 ]; then
  echo "plan.sh: physics skipped: $call's preflight says why (physics.reason in preflight_$call.json)"
  rc=4
elif [ "$call" = call2 ]; then  # GPU physics: MJX against CPU MuJoCo (embodied/bench/envs.py)
  PRUN=runs/device/physics$cpu
  rm -rf "$PRUN"
  timeout --kill-after=15 "$PHYSICS_LIMIT" "$PY" -m embodied.cli bench envs "bench.env_backends=[mjx]" \
    "${PHYS[@]}" "run_dir=$PRUN" >"$OUT/physics_$call.log" 2>&1
  prc=$?
  for f in bench_envs.json bench_envs_partial.json; do
    [ -f "$PRUN/$f" ] && cp "$PRUN/$f" "$OUT/bench_envs_$call.json" && break
  done
  grep -E "^(machine|mjx|place|carry|push)" "$OUT/physics_$call.log" | tail -20
  echo "plan.sh: physics exit $prc after $(($(date +%s) - t0)) s"
  [ "$rc" = 0 ] && rc=$prc
fi
command -v nvidia-smi >/dev/null && [ "$cpu" != "--cpu" ] && nvidia-smi >"$OUT/nvidia_smi_$call.txt" 2>&1
echo "plan.sh: $call exit $rc after $(($(date +%s) - t0)) s; results in $OUT"
exit $rc
