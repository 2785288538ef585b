"""Rebuild an env-feedback run's results.md / results.json from its saved stage results, with the answer
spread recomputed from the saved predictions by the current `action_spread` (letters for grid records).

A stage is reused only with the same code (its key holds a hash of the package), so after a change that
touches only the report this rebuilds the tables without training again:

    PYTHONPATH=. python docs/results/scripts/env_feedback_rebuild.py RUN_DIR [BEST_CONSTANT_JSON] key=value \\
        ...

with the overrides the run was made with (`configs/experiment_env_feedback.yaml` underneath).
BEST_CONSTANT_JSON defaults to `env.root/best_constant.json`. Letters are read back through the current
tasks' `answer_grid`, so rebuild with the grids the run was made with.
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

from embodied.config import load_config
from embodied.data.load import load_records
from embodied.envs import answer_form
from embodied.eval.env_stats import action_spread
from embodied.experiments.config import EnvFeedbackRun
from embodied.experiments.env_report import write_env_report

out, args = Path(sys.argv[1]), sys.argv[2:]
const_path = Path(args.pop(0)) if args and args[0].endswith(".json") else None
cfg = load_config("configs/experiment_env_feedback.yaml", args, schema=EnvFeedbackRun)
recs = {r["id"]: answer_form(r, cfg.env.answer) for r in load_records(cfg.env.root, "test")}
constant = json.loads((const_path or Path(cfg.env.root) / "best_constant.json").read_text())
if constant["key"]["env"].get("answer") != cfg.env.answer:
    raise SystemExit(f"best_constant.json was made for env.answer={constant['key']['env'].get('answer')}")
constant = constant["row"]
rows = []
for seed in cfg.env_feedback.seeds:
    stages, timings, scored = {}, {}, {}
    for stage in ["start", *cfg.env_feedback.arms]:
        row = json.loads((out / f"seed{seed}" / stage / "result.json").read_text())["row"]
        saved = json.loads((out / f"seed{seed}" / stage / "predictions.json").read_text())
        preds = saved["env"]["predictions"]
        by_task = defaultdict(list)
        for p in preds:
            by_task[p["task"]].append(p)
        for t, ps in by_task.items():
            row["figures"]["env"]["per_task"][t]["spread"] = action_spread(ps, recs)
        stages[stage] = row["figures"]
        timings[stage] = row["train_s"]
        if "answers_scored" in row:
            scored[stage] = row["answers_scored"]
    rows.append(
        {"seed": seed, "stages": stages, "videos": {}, "timings_s": timings, "answers_scored": scored}
    )
summary = write_env_report(rows, constant, out, cfg)
# the run's own total (the wall clock of the run, not of this rebuild) where its results.json recorded one
old = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {}
total = old.get("timings_s", {}).get("total")
summary["timings_s"] = {"per_seed": [r["timings_s"] for r in rows]} | ({"total": total} if total else {})
summary["rebuilt_from_saved_stages"] = True
(out / "results.json").write_text(json.dumps(summary, indent=2, default=float))
print((out / "results.md").read_text())
