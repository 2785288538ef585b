"""`embodied bench step` at tiny size on the CPU: every figure present and sane, the tokens it counts equal
to the batches the loops ran, and the FLOP count worked out by hand."""

from __future__ import annotations

import json

import pytest

from embodied.bench import flops
from embodied.bench.config import BenchRun
from embodied.config import load_config

OVERRIDES = [
    "policy.path=tiny-base",
    "sft.batch_size=4",
    "grpo.prompts_per_step=2",
    "grpo.group_size=4",
    "grpo.max_new_tokens=12",
    "bench.steps=2",
    "bench.warmup=1",
    "bench.step_reward=timing",  # the tiny base's answers often earn equal MCQ rewards: zero advantages
    "threads=1",  # two threads on a shared, loaded 2-core machine run 10x slower (docs/benchmarks.md)
]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """`(cfg, result)` of one tiny bench step run through the command's own dispatch (`run.named`)."""
    from embodied import run

    out = tmp_path_factory.mktemp("bench_step")
    cfg = load_config(None, [*OVERRIDES, f"run_dir={out}"], schema=BenchRun)
    result = run.named("embodied.bench", "step", cfg, progress=False)
    assert json.loads((out / "bench_step.json").read_text()) == result
    return cfg, result, out


def test_the_json_names_the_device_and_gives_every_figure(measured):
    cfg, r, _ = measured
    assert r["benchmark"] == "step"
    assert r["device"]["type"] == "cpu" and r["device"]["name"] and r["device"]["peak_flops"] > 0
    for phase in ("sft", "grpo"):
        p = r[phase]
        assert p["s_per_step"]["n"] == cfg.bench.steps and p["s_per_step"]["median"] > 0
        assert p["prompt_tokens_per_s"] > 0 and p["completion_tokens_per_s"] > 0
        assert p["model_flops_per_step"] > 0 and p["model_tflops_per_s"] > 0
        assert 0 < p["mfu"] < 1, p["mfu"]
        assert p["peak_memory"]["gib"] > 0.1  # the process holds torch and a model: more than 100 MiB
    g = r["grpo"]
    assert g["generated_tokens_per_s"] > 0
    assert g["reward"].startswith("timing")  # the JSON says the reward was made for timing
    rows = cfg.grpo.prompts_per_step * cfg.grpo.group_size
    assert g["advantages"]["n"] == rows * cfg.bench.steps  # the timed steps' updates, read as they ran
    assert g["advantages"]["nonzero_fraction"] == 1.0 and g["advantages"]["abs_mean"] > 0.1
    assert 0 < g["seconds_in"]["generate"] <= g["seconds_in"]["rollout"]
    assert g["seconds_in"]["rollout"] + g["seconds_in"]["update"] <= sum(
        json.loads(x)["time/step"] for x in (measured[2] / "grpo" / "timed" / "metrics.jsonl").open()
    )
    if r["trl"]["status"] == "ran":
        assert r["trl"]["ours_over_trl_median"] > 0
    else:
        assert r["trl"]["status"] == "trl not installed"


def test_sft_tokens_are_the_batches_the_loop_encoded(measured):
    """Encode the timed call's batches independently (its data order and targets are seeded by seed + 1)."""
    from embodied.bench.step import make_examples
    from embodied.policy.model import encode_completions, encode_examples, load
    from embodied.train.common import index_batches
    from embodied.train.sft import sft_targets

    cfg, r, _ = measured
    examples = make_examples(cfg, 2 * max(cfg.sft.batch_size, cfg.grpo.prompts_per_step))
    _, processor = load(cfg.policy)
    order = index_batches(len(examples), cfg.sft.batch_size, cfg.seed + 1)
    prompt = target = 0
    for step in range(1, cfg.bench.steps + 1):
        rows = [examples[i] for i in next(order)]
        prompt += int(encode_examples(processor, rows, cfg.video)["attention_mask"].sum())
        texts = sft_targets([e.record for e in rows], cfg.sft, cfg.seed + 1, step)
        target += int(encode_completions(processor, texts)[1].sum())
    assert r["sft"]["tokens"]["prompt"] == prompt
    assert r["sft"]["tokens"]["completion"] == target
    assert r["sft"]["tokens"]["visual_items"] == cfg.sft.batch_size * cfg.bench.steps


def test_grpo_tokens_are_the_rollouts_the_loop_sampled(measured):
    """Completion tokens against the loop's own `rollout/len`; prompt tokens against the prompts drawn."""
    from embodied.bench.step import make_examples
    from embodied.policy.model import encode_examples, load
    from embodied.train.common import index_batches

    cfg, r, out = measured
    rows = cfg.grpo.prompts_per_step * cfg.grpo.group_size
    metrics = [json.loads(x) for x in (out / "grpo" / "timed" / "metrics.jsonl").open()]
    lens = [m["rollout/len"] for m in metrics if "rollout/len" in m]
    assert len(lens) == cfg.bench.steps
    assert r["grpo"]["tokens"]["completion"] == round(sum(lens) * rows)
    examples = make_examples(cfg, 2 * max(cfg.sft.batch_size, cfg.grpo.prompts_per_step))
    _, processor = load(cfg.policy)
    order = index_batches(len(examples), cfg.grpo.prompts_per_step, cfg.seed + 1)
    prompt = sum(
        int(encode_examples(processor, [examples[i] for i in next(order)], cfg.video)["attention_mask"].sum())
        for _ in range(cfg.bench.steps)
    )
    assert r["grpo"]["tokens"]["prompt"] == prompt


def test_flops_by_hand():
    shape = flops.Shape(
        n_lm=100, n_vis=10.0, layers=2, d_attn=8, vis_layers=3, vis_d_attn=4, vis_full=(2,), vis_window=4
    )
    # prompt 3, completions 1 and 2: tokens 6 -> 2*100*6 = 1200; pairs 9 + 1*4 + 2*5 = 23 -> 4*2*8*23 = 1472
    assert flops.group_forward(shape, 3, (1, 2)) == 1200 + 1472
    # one clip (2, 2, 2) = 8 patches: 2*10*8 = 160; 1 full block 8*8 = 64 pairs, 2 windowed 8*min(4, 4) = 32
    # each -> 4*4*(64 + 64) = 2048
    assert flops.vision_forward(shape, [(2, 2, 2)]) == 160 + 2048
    # SFT: 3 forwards of a 5-token row (2*100*5 + 4*2*8*25 = 2600) and the clip (2208)
    assert flops.sft_step(shape, [5], [(2, 2, 2)]) == 3 * (2600 + 2208)
    assert flops.update_forwards(kl=True, updates=1) == 4  # reference + 3
    assert flops.update_forwards(kl=False, updates=2) == 7  # old policy + 2 x 3


def test_the_tiny_models_shape_counts_the_head_and_not_the_table(tiny_policy):
    model, _ = tiny_policy
    shape = flops.model_shape(model)
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert shape.n_lm == total - vision - emb.numel() + (head.numel() if head is emb else 0)
    assert shape.vis_layers == model.config.vision_config.depth
    assert shape.vis_window == (112 // 14) ** 2 and shape.vis_full == (1,)


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100 (SXM or PCIe)"),
        ("NVIDIA A100 80GB PCIe", "A100 (SXM or PCIe)"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
    ],
)
def test_gpu_names_find_their_peak(name, label):
    assert flops.gpu_peak(name)[0] == label


def test_an_unknown_gpu_has_no_peak():
    assert flops.gpu_peak("NVIDIA GeForce GTX 1080") is None
