"""`embodied export` and the verl / EasyR1 reward entry point on real data: a generated dataset with every
question family and interactive episodes of every task, written as parquet, read back with Hugging Face
`datasets`, and scored by `embodied/integrations/verl_reward.py` exactly as the trainer scores.

The last test (marker `verl`) runs verl 0.9.1's own code in `.venv-verl` (made by scripts/setup_verl.sh):
its `RLHFDataset` on the export, `get_custom_reward_fn` on the reward file, and its reward managers.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from embodied.cli import main
from embodied.config import GRPOConfig
from embodied.data.build import generate_dataset
from embodied.data.episodes import generate_episodes
from embodied.data.load import load_records
from embodied.data.schema import DataConfig, kind
from embodied.envs import TASKS as ENV_TASKS
from embodied.envs import is_interactive, push, task
from embodied.envs.config import EnvConfig
from embodied.integrations import verl_reward
from embodied.integrations.export import export_dataset
from embodied.questions import FAMILIES as QUESTION_FAMILIES
from embodied.questions import LETTERS, FamilySpec, format_question
from embodied.rl.rewards import mcq_rewards, option_orders, routed_rewards
from embodied.video import VideoConfig, frame_pixel_cap, read_video

ROOT = Path(__file__).parents[1]
VERL_PYTHON = ROOT / ".venv-verl" / "bin" / "python"
FAMILIES = [
    FamilySpec(family="arrow_of_time"),
    FamilySpec(family="spatial_puzzle"),
    FamilySpec(family="spatial_puzzle", variant="patch"),
    FamilySpec(family="temporal_puzzle"),
    FamilySpec(family="object_permanence", scene="occluder"),
]


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """`(mcq_root, episodes_root)`: 10 train and 5 test questions over every family (64 px), and one test
    episode of every interactive task (~2 s together)."""
    mcq = tmp_path_factory.mktemp("mcq")
    data = DataConfig(root=str(mcq), width=64, height=64, workers=0, families=FAMILIES, sheets=False)
    data.n_train, data.n_val, data.n_test = 10, 0, 5
    generate_dataset(data, progress=False)
    env = EnvConfig(root=str(tmp_path_factory.mktemp("env")), n_train=0, n_test=1)
    generate_episodes(env, progress=False)
    return mcq, Path(env.root)


def answers(record: dict, rng: np.random.Generator) -> list[str]:
    """Responses that exercise every branch of the reward: right, wrong, unformatted, hedged, unparseable;
    for an interactive task, a good (push) or random action, also without the think block."""
    if is_interactive(record):
        act = (
            f"{push.good_action(record):.3f}"
            if record["task"] == "push"
            else task(record["task"]).random_answer(rng)
        )
        return [f"<think>ok</think><answer>{act}</answer>", f"<answer>{act}</answer>", "no idea"]
    right = record["answer"]
    wrong = next(x for x in LETTERS[: len(record["options"])] if x != right)
    return [
        f"<think>because</think><answer>{right}</answer>",
        f"<think>hm</think><answer>{wrong}</answer>",
        f"<answer>{right}</answer>",
        f"<think></think><answer>{right}</answer><answer>{wrong}</answer>",
        "no idea",
    ]


def scored_cases(roots) -> list[tuple[dict, str]]:
    mcq, env = roots
    rng = np.random.default_rng(0)
    records = load_records(mcq, "test") + load_records(env, "test")
    return [(r, a) for r in records for a in answers(r, rng)]


def test_export_verl_reads_back_with_datasets(roots, tmp_path):
    from datasets import load_dataset

    mcq, env = roots
    video = VideoConfig()
    summary = export_dataset(mcq, tmp_path / "mcq", "verl", video)
    assert summary["splits"]["train"]["rows"] == 10 and summary["splits"]["test"]["rows"] == 5
    assert "val" not in summary["splits"] and summary["empty_splits"] == ["val"]  # n_val=0
    export_dataset(env, tmp_path / "env", "verl", video)
    for root, out in ((mcq, tmp_path / "mcq"), (env, tmp_path / "env")):
        ds = load_dataset("parquet", data_files=str(out / "test.parquet"), split="train")
        records = load_records(root, "test")
        assert len(ds) == len(records)
        for row, rec in zip(ds, records):
            assert row["data_source"] == f"embodied/{kind(rec)}" and row["ability"] == "physics"
            assert row["reward_model"]["style"] == "rule"
            assert json.loads(row["reward_model"]["ground_truth"]) == rec  # the whole record survives
            text = format_question(rec["question"], rec["options"], rec.get("instruction"))
            assert row["prompt"] == [{"role": "user", "content": "<video>" + text}]
            (item,) = row["videos"]
            assert Path(item["video"]) == (root / rec["video"]).resolve() and Path(item["video"]).is_file()
            assert item["fps"] == 2.0 and item["max_frames"] == 32
            assert row["extra_info"]["id"] == rec["id"] and row["extra_info"][
                "interactive"
            ] == is_interactive(rec)
    tasks = set(
        load_dataset("parquet", data_files=str(tmp_path / "mcq" / "train.parquet"), split="train")[
            "data_source"
        ]
    )
    assert tasks == {f"embodied/{t}" for t in QUESTION_FAMILIES}


@pytest.mark.parametrize("patch", [14, 16])
def test_exported_video_fields_give_our_frames_in_qwen_vl_utils(roots, tmp_path, patch):
    """The fields verl hands to `qwen_vl_utils.fetch_video` sample as many frames as our reader at 2 fps and
    size them within our per-frame cap (fetch_video on the decoded frames: no video decoder needed), for
    Qwen2.5-VL's 14 px patches and Qwen3-VL's 16 px ones (verl passes the processor's `image_patch_size`)."""
    import av
    import pyarrow.parquet as pq
    from PIL import Image
    from qwen_vl_utils.vision_process import fetch_video, smart_nframes

    mcq, _ = roots
    video = VideoConfig()
    export_dataset(mcq, tmp_path, "verl", video, ["test"])
    counts = set()
    for row in pq.read_table(tmp_path / "test.parquet").to_pylist():
        item = row["videos"][0]
        with av.open(item["video"]) as container:  # what a decoder reports: stored frames and their rate
            stream = container.streams.video[0]
            total, rate = sum(1 for _ in container.decode(stream)), float(stream.average_rate)
        ours = read_video(item["video"], fps=video.fps, max_frames=video.max_frames)
        n = smart_nframes(item, total_frames=total, video_fps=rate)
        assert n == len(ours.frames) - len(ours.frames) % 2  # qwen keeps an even count (2-frame patches)
        frames = [Image.fromarray(f) for f in ours.frames[:n]]
        pixels = fetch_video({**item, "video": frames}, image_patch_size=patch)
        assert pixels.shape[0] == n and pixels.shape[-2] * pixels.shape[-1] <= frame_pixel_cap(n, video)
        counts.add(n)
    assert len(counts) > 1  # still pairs and longer clips both checked


def test_reward_entry_equals_the_trainer_reward(roots):
    cases = scored_cases(roots)
    assert {kind(r) for r, _ in cases} == set(QUESTION_FAMILIES) | set(ENV_TASKS)
    g = GRPOConfig()
    trainer = routed_rewards(
        EnvConfig().backend, EnvConfig().format_weight, g.accuracy_weight, g.format_weight
    )
    grpo_default = mcq_rewards(g.accuracy_weight, g.format_weight, g.order_credit)
    seen = set()
    for record, text in cases:
        gt = json.dumps(record)
        got = verl_reward.compute_score(f"embodied/{kind(record)}", text, gt, {"index": 0})
        want = trainer([text], [record])[0]
        assert got["score"] == want["reward/total"], (kind(record), text)
        if not is_interactive(record):
            assert got["score"] == grpo_default([text], [record])[0]["reward/total"]
        seen.add(got["score"])
    assert len(seen) >= 5  # right, wrong, unformatted, unparseable and simulated outcomes all differ
    # the batch entry points (verl's batch manager, EasyR1) agree with the per-response one
    texts, records = [t for _, t in cases], [r for r, _ in cases]
    gts = [json.dumps(r) for r in records]
    batch = verl_reward.compute_score_batch([f"embodied/{kind(r)}" for r in records], texts, gts)
    easy = verl_reward.easyr1_compute_score(
        [{"response": t, "response_length": 1, "ground_truth": g} for t, g in zip(texts, gts)]
    )
    want = [t["reward/total"] for t in trainer(texts, records)]
    assert [b["score"] for b in batch] == want and [e["overall"] for e in easy] == want


def test_reward_kwargs_reach_the_trainer_reward(roots):
    """verl's `reward_kwargs` (here Visual Jigsaw's partial credit on orders) change the score as they change
    the trainer's; an unknown name is an error, not a silent default; a bad ground truth says what it is."""
    mcq, _ = roots
    ordering = [r for r in load_records(mcq, "train") + load_records(mcq, "test") if option_orders(r)]
    cases = [
        (r, f"<think></think><answer>{x}</answer>") for r in ordering for x in LETTERS[: len(r["options"])]
    ]
    credited = 0
    for record, text in cases:
        source = f"embodied/{kind(record)}"
        got = verl_reward.compute_score(source, text, json.dumps(record), order_credit=0.2)
        want = mcq_rewards(1.0, 0.5, 0.2)([text], [record])[0]
        assert got["score"] == want["reward/total"]
        credited += 0 < want["reward/order_credit"] < 1
    assert credited > 0  # some wrong order earned partial credit: the options reached the reward
    record, text = cases[0]
    with pytest.raises(TypeError, match="format_wieght"):
        verl_reward.compute_score("embodied/temporal_puzzle", text, json.dumps(record), format_wieght=1.0)
    with pytest.raises(ValueError, match="neither a record"):
        verl_reward.compute_score("embodied/x", text, "forward")
    assert (
        verl_reward.compute_score("embodied/arrow_of_time", "<think></think><answer>B</answer>", "B")["score"]
        == 1.5
    )


def test_reward_defaults_are_the_trainer_defaults():
    import inspect

    g, e = GRPOConfig(), EnvConfig()
    mine = (verl_reward.ACCURACY_WEIGHT, verl_reward.FORMAT_WEIGHT, verl_reward.ORDER_CREDIT)
    assert mine == (g.accuracy_weight, g.format_weight, g.order_credit)
    defaults = inspect.signature(verl_reward.score_responses).parameters
    assert (
        defaults["env_format_weight"].default == e.format_weight and defaults["backend"].default == e.backend
    )
    assert defaults["timeout_s"].default == g.reward_timeout_s


def test_export_cli_easyr1(roots, tmp_path, capsys):
    from datasets import load_dataset

    mcq, _ = roots
    assert main(["export", "--format", "easyr1", f"data.root={mcq}", f"run_dir={tmp_path}", "-q"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == "easyr1" and json.loads((tmp_path / "export.json").read_text()) == summary
    assert "data.video_fps=2.0" in summary["easyr1_overrides"]
    ds = load_dataset("parquet", data_files=str(tmp_path / "train.parquet"), split="train")
    assert set(ds.column_names) == {"prompt", "answer", "videos"}
    row, rec = ds[0], load_records(mcq, "train")[0]
    assert row["prompt"].startswith("<video>") and json.loads(row["answer"]) == rec
    assert (
        main(["export", "--format", "verl", f"data.root={tmp_path / 'none'}", f"run_dir={tmp_path}", "-q"])
        == 1
    )
    assert "holds no <split>.jsonl" in capsys.readouterr().err


def documented_verl_overrides() -> list[str]:
    """The `key=value` arguments of the `verl.trainer.main_ppo` command in docs/scaling.md (as a shell would
    pass them)."""
    import re
    import shlex

    text = (ROOT / "docs" / "scaling.md").read_text()
    block = re.search(r"```bash\n(\.venv-verl/bin/python -m verl\.trainer\.main_ppo.*?)```", text, re.S)
    assert block, "docs/scaling.md lost its verl command"
    words = shlex.split(block.group(1).replace("\\\n", " "))
    return [w for w in words if "=" in w]


@pytest.mark.verl
def test_verl_loads_the_export_and_scores_like_the_trainer(roots, tmp_path):
    """verl 0.9.1 itself, in its own environment: `RLHFDataset` on the exported parquet builds the prompt our
    trainer builds; `get_custom_reward_fn` loads the reward file; verl's reward managers (the reward loop's
    and the legacy naive and batch ones) give the trainer's reward at the last response token."""
    if not VERL_PYTHON.is_file():
        pytest.skip(
            "no .venv-verl: run scripts/setup_verl.sh (verl pins transformers<5.11, so it lives apart)"
        )
    from embodied.policy.model import load_policy, prompt_text
    from embodied.policy.tiny import SHIPPED

    mcq, env = roots
    for name, root in (("mcq", mcq), ("env", env)):
        export_dataset(root, tmp_path / name, "verl", VideoConfig(), ["test"])
    _, processor = load_policy(SHIPPED)
    cases = scored_cases(roots)
    trainer = routed_rewards()
    spec = {
        "parquet": [str(tmp_path / n / "test.parquet") for n in ("mcq", "env")],
        "tokenizer": str(SHIPPED),
        "reward_file": str(ROOT / "embodied" / "integrations" / "verl_reward.py"),
        "cache": str(tmp_path / "verl_cache"),
        "overrides": documented_verl_overrides(),
        "prompts": {r["id"]: prompt_text(processor, r) for r, _ in cases},
        "cases": [
            {"id": r["id"], "text": t, "score": trainer([t], [r])[0]["reward/total"]} for r, t in cases
        ],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(VERL_PYTHON), str(Path(__file__).with_name("verl_env_check.py")), str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["rows"] == len(spec["prompts"]) and report["prompts_equal"] == report["rows"]
    assert report["command_composes"] is True
    assert report["verl"] == "0.9.1" and report["transformers"].startswith("5.1")
    n = len(spec["cases"])
    assert report["custom_fn_equal"] == n and report["loop_manager_equal"] == n
    assert report["naive_manager_equal"] == n and report["batch_manager_equal"] == n
    print(f"verl check: {time.perf_counter() - t0:.1f} s in .venv-verl: {report}")
