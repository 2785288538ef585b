"""`embodied experiment cosmos` at toy size: every row, the targets, transfer, reuse."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from embodied.config import load_config
from embodied.experiments.config import CosmosRun
from embodied.policy.model import load_policy

REPO = Path(__file__).parents[1]


@pytest.mark.slow  # 21 s: the experiment end to end (its pieces are tested by default below)
def test_cosmos_experiment_end_to_end(tmp_path):
    from embodied.experiments.cosmos import run

    overrides = [
        f"data.root={tmp_path}/mix", "data.n_train=24", "data.n_val=2", "data.n_test=2", "data.workers=0",
        "sft.steps=2", "sft.batch_size=4", "grpo.steps=1",
        "grpo.prompts_per_step=2",
        "grpo.group_size=2", "grpo.max_new_tokens=8", "cosmos.seeds=[0,1]", "cosmos.workers=1",
        "cosmos.format_steps=1", "cosmos.benchmark_n_test=16", "eval.max_new_tokens=8",
        "cosmos.curriculum=[{families: [arrow_of_time], steps: 2}]",
        "sft.rationale=none", "sft.answer_as=letter",  # letters fit the 8 new tokens of this short test
    ]  # fmt: skip
    files = [REPO / "configs/physics_mix.yaml", REPO / "configs/experiment_cosmos.yaml"]
    cfg = load_config(files, overrides, schema=CosmosRun)
    spec = (
        (REPO / "configs/physics_bench.yaml")
        .read_text()
        .replace("data/benchmarks/physics_v1", f"{tmp_path}/bench")
    )
    (tmp_path / "bench.yaml").write_text(spec.replace("num_frames: 8", "num_frames: 4"))
    cfg.cosmos.benchmark = str(tmp_path / "bench.yaml")
    result = run(cfg, tmp_path / "run", progress=False)
    assert set(result["table"]) == {
        "base",
        "sft",
        "sft_grpo",
        "sft_grpo_credit",  # the default config's partial-order-credit arm
        "more_sft",
        "grpo_only",
        "blind",
        "single_frame",
    }
    for row in result["table"].values():
        assert set(row) == set(result["families"]) | {"average"}
        for cell in row.values():
            assert cell["ci95"][0] <= cell["mean"] <= cell["ci95"][1]
    assert set(result["families"]) <= {
        "arrow_of_time",
        "temporal_puzzle",
        "spatial_puzzle",
        "object_permanence",
    }
    assert result["transfer"]["scenes"] and "drop" not in result["transfer"]["scenes"]
    assert "slide" not in result["transfer"]["scenes"]
    tr = result["transfer"]  # the continued-SFT control on the held-out scenes, and GRPO minus it
    assert {"sft", "sft_grpo", "more_sft", "grpo_minus_more_sft"} <= set(tr)
    runs = [json.loads((tmp_path / f"run/seed{s}/transfer/result.json").read_text())["row"] for s in (0, 1)]
    diffs = [r["sft_grpo"]["accuracy"] - r["more_sft"]["accuracy"] for r in runs]
    assert tr["grpo_minus_more_sft"]["mean"] == pytest.approx(sum(diffs) / 2)
    assert (
        all(r["more_sft_steps"] >= 1 for r in runs) and len(result["timings_s"]["transfer/more_sft_s"]) == 2
    )
    assert len(result["timings_s"]["main/more_sft_steps"]) == 2
    assert len(result["timings_s"]["main/credit_s"]) == 2
    main = json.loads((tmp_path / "run/seed0/main/result.json").read_text())["row"]
    assert len(main["sft_stages_s"]) == 2  # the curriculum stage, then the mix
    assert main["sft_s"] == pytest.approx(sum(main["sft_stages_s"]), abs=0.11)
    credit = result["targets"]["credit_minus_exact"]
    assert set(credit) == set(result["families"]) & {"spatial_puzzle", "temporal_puzzle"}
    assert isinstance(result["probe"], dict)
    bench = json.loads(next((tmp_path).glob("bench_n16_112x112_4f/manifest.json")).read_text())
    assert bench["config"]["clip"]["num_frames"] == 4  # rendered like the training clips
    for name in ("cosmos.md", "cosmos.json", "cosmos.png"):
        assert (tmp_path / "run" / name).stat().st_size > 0
    text = (tmp_path / "run" / "cosmos.md").read_text()
    assert "SFT + more SFT" in text and "Transfer" in text and "| chance |" in text
    assert "SFT 2 on arrow_of_time, then 2 steps on every family" in text
    stage = [json.loads(line) for line in (tmp_path / "run/seed0/main/stage0/metrics.jsonl").open()]
    assert stage[-1]["step"] == 2  # the curriculum stage ran before the mix
    again = run(cfg, tmp_path / "run", progress=False)  # every job reused
    assert json.dumps(again["table"], sort_keys=True) == json.dumps(result["table"], sort_keys=True)
    # sft_only: the main job stops at its SFT row, which is the full run's; only the SFT target is checked
    cfg.cosmos.sft_only = True
    short = run(cfg, tmp_path / "sft_only", progress=False)
    assert set(short["table"]) == {"base", "sft"}
    same = json.dumps(short["table"]["sft"], sort_keys=True) == json.dumps(
        result["table"]["sft"], sort_keys=True
    )
    assert same
    assert set(short["targets"]) == {"sft_above_chance"} and set(result["targets"]) >= {
        "sft_above_chance", "sft_grpo_above_chance", "grpo_minus_more_sft", "baselines_contain_chance"
    }  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "sft_only" / "seed0").iterdir()) == ["main"]
    text = (tmp_path / "sft_only" / "cosmos.md").read_text()
    assert "Families whose SFT interval lies above chance" in text
    # keep_weights: a row saved without weights is recomputed once, with the SFT policy saved; same numbers
    saved = tmp_path / "sft_only" / "seed0" / "main" / "result.json"
    before = saved.stat().st_mtime_ns
    cfg.cosmos.keep_weights = True
    kept = run(cfg, tmp_path / "sft_only", progress=False)
    assert saved.stat().st_mtime_ns != before
    assert kept["table"]["sft"] == short["table"]["sft"]
    model_dir = tmp_path / "sft_only" / "seed1" / "main" / "sft" / "model"
    assert (model_dir / "model.safetensors").is_file()
    load_policy(model_dir)  # loads as a `policy.path`
    after = saved.stat().st_mtime_ns
    run(cfg, tmp_path / "sft_only", progress=False)  # now reused, weights and all
    assert saved.stat().st_mtime_ns == after
    cfg.cosmos.keep_weights = False
    # docs/results/scripts/cosmos_arms.py pairs two runs' SFT rows by seed: the same rows differ by 0 on
    # every seed
    script = REPO / "docs" / "results" / "scripts" / "cosmos_arms.py"
    spec = importlib.util.spec_from_file_location("cosmos_arms", script)
    arms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arms)
    both = arms.compare({"full": tmp_path / "run", "sft only": tmp_path / "sft_only"}, "sft")
    assert all(d["per_seed"] == [0.0, 0.0] for d in both["minus_control"]["sft only"].values())
    full = both["arms"]["full"]
    assert full["family"]["average"]["mean"] == pytest.approx(
        result["table"]["sft"]["average"]["mean"], abs=1e-4
    )
    assert full["seeds"] == [0, 1] and full["provenance"]["code"] and full["data"]["n_train"] == 24
    assert "| family (chance) | full | sft only |" in arms.markdown(both)
    with pytest.raises(SystemExit, match="sft_grpo"):
        arms.compare({"sft only": tmp_path / "sft_only"}, "sft_grpo")  # sft_only has no GRPO row


def test_curriculum_examples_pick_the_stage_families():
    import pytest

    from embodied.experiments.cosmos import curriculum_examples

    class E:
        def __init__(self, family):
            self.record = {"family": family}

    train = [E("arrow_of_time"), E("spatial_puzzle"), E("arrow_of_time")]
    assert len(curriculum_examples(train, ["arrow_of_time"])) == 2
    assert len(curriculum_examples(train, ["arrow_of_time", "spatial_puzzle"])) == 3
    with pytest.raises(ValueError, match="object_permanence.*the data has"):
        curriculum_examples(train, ["object_permanence"])


def test_trace_targets_must_fit_the_responses_grpo_and_eval_generate(tiny_path):
    """`sft.rationale=trace` makes targets longer than GRPO's default 16 new tokens: the cosmos main job
    refuses to start rather than train on answers that GRPO and the evaluation would cut off."""
    import dataclasses

    import pytest

    from embodied.experiments.cosmos import check_response_room
    from embodied.policy.model import load_policy
    from embodied.questions import LETTERS
    from embodied.train.sft import longest_target

    class E:
        def __init__(self, shown):
            answer = [shown.index(i) + 1 for i in range(len(shown))]
            opts = [", ".join(map(str, answer)), "2, 1, 4, 3", "4, 3, 2, 1", "3, 4, 1, 2"]
            self.record = {
                "family": "temporal_puzzle",
                "options": opts,
                "answer": LETTERS[0],
                "meta": {"shown_order": shown},
            }

    train = [E([2, 0, 3, 1]), E([1, 0, 2, 3])]
    _, processor = load_policy(tiny_path)
    cfg = load_config(None)
    assert longest_target(processor, [e.record for e in train], cfg.sft) == 6  # <think></think>, letter, end
    trace = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, rationale="trace"))
    need = longest_target(processor, [e.record for e in train], trace.sft)
    assert 16 < need <= 48
    check_response_room(cfg, processor, train)  # no trace: fits
    with pytest.raises(ValueError, match="grpo.max_new_tokens"):
        check_response_room(trace, processor, train)
    roomy = dataclasses.replace(trace, grpo=dataclasses.replace(trace.grpo, max_new_tokens=need))
    check_response_room(roomy, processor, train)


def test_a_job_is_reused_only_under_the_same_evaluation_budget(tmp_path, monkeypatch):
    """The reuse key of every cosmos job and of the base row holds the evaluation settings: a row scored
    with 48 new tokens is not reused for a run that allows 80 (bench_eval depends on them)."""
    import dataclasses

    from embodied.experiments import cosmos

    keys = []
    monkeypatch.setattr(cosmos, "reuse_or_run", lambda path, key, *a, **k: keys.append(key) or {})
    cfg = load_config([REPO / "configs/experiment_cosmos.yaml"], schema=CosmosRun)
    longer = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, max_new_tokens=80))
    for c in (cfg, longer):
        cosmos.run_job(c, tmp_path, 0, "main")
        cosmos._base(c, {}, tmp_path)
    job, base, job80, base80 = keys
    assert job["eval"]["max_new_tokens"] != job80["eval"]["max_new_tokens"]
    assert base["eval"] != base80["eval"]
    assert {k: v for k, v in job.items() if k != "eval"} == {k: v for k, v in job80.items() if k != "eval"}
