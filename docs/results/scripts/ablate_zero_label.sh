#!/usr/bin/env bash
# The ablation table of docs/results/zero_label.md: the zero-label run (format-only start, seed 0, 100 GRPO steps)
# with one ingredient of the recipe removed at a time. About 4 minutes per row on 2 CPU cores.
# Usage: [THREADS=N] docs/results/scripts/ablate_zero_label.sh [OUT_DIR]   (default runs/ablate)
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-runs/ablate}"
e=".venv/bin/embodied"
common=(-c configs/experiment_zero_label.yaml "zero_label.starts=[format]" "zero_label.seeds=[0]" grpo.steps=100 threads="${THREADS:-0}" -q)
mkdir -p "$out"
# Bases without one pretraining stage: captions only (no vision stage), vision stage only (no captions).
[ -f "$out/base_no_vision_stage/config.json" ] ||
  $e pretrain threads="${THREADS:-0}" pretrain.vision_steps=0 pretrain.out="$out/base_no_vision_stage" run_dir="$out/pretrain_nv" -q
[ -f "$out/base_no_captions/config.json" ] ||
  $e pretrain threads="${THREADS:-0}" pretrain.steps=0 pretrain.out="$out/base_no_captions" run_dir="$out/pretrain_nc" -q
run() { name=$1; shift; $e experiment zero-label "${common[@]}" run_dir="$out/$name" "$@" > "$out/$name.log" 2>&1; }
run full
run no_pretraining policy.path=tiny
run no_vision_stage policy.path="$out/base_no_vision_stage"
run no_captions policy.path="$out/base_no_captions"
run no_kl grpo.kl_coef=0
for d in full no_pretraining no_vision_stage no_captions no_kl; do
  python3 -c "import json,sys; r=json.load(open('$out/$d/zero_label.json'))['runs'][0]; v=r['curves']['val'];
print('$d', r['start_test'], r['grpo_test'], r['grpo_ci95'], ' '.join(f'{s}:{a:.2f}' for s,_,a in v))"
done
