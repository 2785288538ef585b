"""Perception pretraining (embodied/train/pretrain.py): hand-worked targets, determinism, the shipped base."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from embodied.config import load_config
from embodied.policy.model import resolve_policy_path
from embodied.policy.tiny import SHIPPED, SHIPPED_WORLDS
from embodied.questions.caption import (
    caption,
    colour_name,
    make_scene_clip,
    observe_scene,
    scene_caption,
    scene_objects,
)
from embodied.run import pretrain
from embodied.train.pretrain import PretrainConfig, occupancy


def test_occupancy_marks_the_squares_objects_fill_in_each_frame():
    frames = np.full((4, 56, 56, 3), 200, dtype=np.uint8)  # grey: no object anywhere
    frames[0, 0:10, 0:10] = (220, 30, 30)  # frame 0: red in the top-left 28 px square (100 of 784 px)
    frames[1, 30:40, 30:40] = (30, 30, 220)  # frame 1: blue in the bottom-right square
    frames[3, 0:3, 29:32] = (30, 220, 30)  # frame 3: 9 px (1.1%) of the top-right square: below 2%
    got = occupancy(frames)
    # rows: (temporal patch, row, col) in raster order; columns: the patch's first and second frame
    want = np.zeros((2, 2, 2, 2), dtype=np.float32)
    want[0, 0, 0, 0] = 1  # patch 0 = frames 0-1, top-left, first frame
    want[0, 1, 1, 1] = 1  # patch 0, bottom-right, second frame
    np.testing.assert_array_equal(got, want.reshape(-1, 2))


def test_colour_occupancy_names_hues_as_the_captions_do_and_splits_occupancy():
    import colorsys

    from embodied.questions.caption import COLOUR_WORDS, COLOURS, colour_index, colour_name

    rng = np.random.default_rng(0)
    rgb = rng.uniform(0, 255, (500, 3)).astype(np.float32)
    idx = colour_index(rgb)
    keep = rgb.max(-1) - rgb.min(-1) > 1  # grey pixels have no hue
    hues = [colorsys.rgb_to_hsv(*(c / 255))[0] for c in rgb[keep]]  # the reference: HSV's hue, binned
    want = [next(name for bound, name in COLOURS if h < bound) for h in hues]
    assert [COLOUR_WORDS[i] for i in idx[keep]] == want
    assert [colour_name(c / 255) for c in rgb[keep]] == want
    frames = np.zeros((4, 112, 112, 3), np.uint8)
    frames[:, 10:30, 10:30] = (230, 30, 30)  # red
    frames[2:, 60:90, 70:100] = (40, 60, 220)  # blue, in the second temporal patch only
    plain, split = occupancy(frames), occupancy(frames, colours=True)
    k = len(COLOUR_WORDS)
    assert split.shape == (plain.shape[0], 2 * k)
    assert np.array_equal(split.reshape(-1, 2, k).max(-1), plain)
    red, blue = COLOUR_WORDS.index("red"), COLOUR_WORDS.index("blue")
    assert split.reshape(-1, 2, k)[:16, :, red].any() and not split.reshape(-1, 2, k)[:16, :, blue].any()
    assert split.reshape(-1, 2, k)[16:, :, blue].any()


def test_caption_lists_objects_left_to_right_with_binned_heights():
    heights = np.array([[0.5, 0.01], [0.1, 0.29], [0.0, 0.3]])  # 3 frames x 2 objects (m above the floor)
    text = caption(["box", "sphere"], ["red", "blue"], heights, xs=np.array([0.4, -0.2]))
    assert text == (
        "2 objects: blue sphere, red box. frame 1: blue floor, red high. "
        "frame 2: blue low, red low. frame 3: blue high, red floor."
    )
    assert colour_name([0.9, 0.1, 0.1]) == "red" and colour_name([0.1, 0.2, 0.9]) == "blue"


def _tiny_run(tmp_path, name, *more):
    cfg = load_config(
        overrides=[
            *more,
            f"run_dir={tmp_path / name}",
            "pretrain.n_clips=16",
            "pretrain.n_val=4",
            "pretrain.vision_steps=2",
            "pretrain.steps=2",
            "pretrain.batch_size=4",
            "pretrain.workers=0",
            "threads=1",
        ]
    )
    return pretrain(cfg, progress=False)


def test_pretrain_is_deterministic_and_writes_a_loadable_policy(tmp_path):
    a, b = _tiny_run(tmp_path, "a"), _tiny_run(tmp_path, "b")
    wa, wb = (load_file(f"{r['model']}/model.safetensors") for r in (a, b))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    base = load_file(f"{resolve_policy_path('tiny')}/model.safetensors")
    assert any(not torch.equal(wa[k], base[k]) for k in wa), "pretraining changed nothing"
    assert set(a["caption_val"]) >= {"count_accuracy", "height_accuracy", "n"}
    assert 0.0 <= a["vision_val"]["occupancy_accuracy"] <= 1.0


def test_pretrain_builds_a_sized_model_with_colour_targets(tmp_path):
    """`pretrain.tiny` sizes the from-scratch model; `vision_target=colour` trains one bit per colour word;
    the scene captions report the colour words apart from the object list."""
    run = _tiny_run(
        tmp_path, "wide", "pretrain.tiny.vision_hidden=96", "pretrain.vision_target=colour",
        "pretrain.captions=scene", "pretrain.scenes=[occluder]",
    )  # fmt: skip
    w = load_file(f"{run['model']}/model.safetensors")
    assert run["parameters"] == sum(t.numel() for t in w.values())
    assert json.loads((tmp_path / "wide/model/config.json").read_text())["vision_config"]["hidden_size"] == 96
    assert set(run["caption_val"]) >= {
        "colour_word_accuracy",
        "colour_word_majority",
        "object_colours_accuracy",
    }
    assert 0.0 < run["caption_val"]["colour_word_majority"] <= 1.0


def test_shipped_base_was_built_by_the_current_defaults():
    path = resolve_policy_path("tiny-base")
    assert path == SHIPPED and (path / "model.safetensors").is_file()
    built = json.loads((path / "embodied_pretrain.json").read_text())
    defaults = dataclasses.asdict(PretrainConfig())
    # fields added after the base was built default to what it was built with (drop captions, from scratch)
    later = {"captions": "drop", "scenes": ["drop"], "num_frames": [4], "init": "", "tiny": {}}
    later |= {"vision_target": "occupancy", "architecture": "qwen2.5-vl"}
    assert {k: defaults[k] for k in later} == later
    assert {k: v for k, v in built["pretrain"].items() if k != "workers"} == {
        k: v for k, v in defaults.items() if k != "workers" and k not in later
    }, "the defaults changed: rebuild with `embodied pretrain pretrain.out=embodied/assets/tiny_base`"
    assert built["vision_val"]["occupancy_accuracy"] > 0.95


def test_shipped_qwen3_vl_base_was_built_by_the_current_defaults():
    """`tiny-base-qwen3-vl` is `embodied pretrain pretrain.architecture=qwen3-vl`: the defaults but that."""
    path = resolve_policy_path("tiny-base-qwen3-vl")
    assert (path / "model.safetensors").is_file()
    assert json.loads((path / "config.json").read_text())["model_type"] == "qwen3_vl"
    built = json.loads((path / "embodied_pretrain.json").read_text())
    defaults = dataclasses.asdict(PretrainConfig()) | {"architecture": "qwen3-vl"}
    assert {k: v for k, v in built["pretrain"].items() if k not in ("workers", "out")} == {
        k: v for k, v in defaults.items() if k not in ("workers", "out")
    }, "defaults changed: rebuild with `embodied pretrain pretrain.architecture=qwen3-vl pretrain.out=DIR`"
    assert built["vision_val"]["occupancy_accuracy"] > 0.95


@pytest.mark.slow
def test_pretrain_rebuilds_the_shipped_base(tmp_path):
    """The documented command reproduces the shipped weights (about 4 minutes on 2 cores)."""
    cfg = load_config(overrides=[f"run_dir={tmp_path}", "threads=2"])
    summary = pretrain(cfg, progress=False)
    new, shipped = (
        load_file(f"{summary['model']}/model.safetensors"),
        load_file(SHIPPED / "model.safetensors"),
    )
    worst = max((new[k] - shipped[k]).abs().max().item() for k in shipped)
    assert worst < 1e-4, f"rebuilt base differs from the shipped one by up to {worst}"


# --- every world: scene captions -----------------------------------------------------------------------


def test_scene_caption_joins_objects_and_frames():
    text = scene_caption(
        ["red box", "blue sphere"],
        [["red d5 upright still", "blue hidden"], ["red e5 tilted moving", "blue out"]],
    )
    assert text == (
        "2 objects: red box, blue sphere. frame 1: red d5 upright still, blue hidden. "
        "frame 2: red e5 tilted moving, blue out."
    )


def test_the_occluder_caption_says_hidden_while_the_world_says_hidden():
    """The ray test agrees with the occluder world's own geometric `hidden` interval (its mid-point), and the
    object is in view before it reaches the screen."""
    from embodied.worlds import make_world

    world = make_world("occluder", 112, 112)
    _, info = world.reset(np.random.default_rng(3), outcome="possible")
    ids = scene_objects(world.model)
    obj = next(g for g in ids if world.model.geom(g).name == "obj")
    mid = (info["hidden"][0] + info["hidden"][1]) / 2
    _, seen = world.record_observed([mid], lambda m, d: observe_scene(m, d, [obj]))
    assert seen[0][0].endswith("hidden"), seen
    _, seen = world.record_observed([info["lift"][1] + 0.5], lambda m, d: observe_scene(m, d, [obj]))
    assert not seen[0][0].endswith(("hidden", "out")), seen


def test_a_toppled_tower_lies_and_rests():
    from embodied.worlds import make_world

    world = make_world("topple", 112, 112)
    _, info = world.reset(np.random.default_rng(0), difficulty="easy")
    ids = scene_objects(world.model)
    _, seen = world.record_observed([0.0, info["motion"][1] + 0.5], lambda m, d: observe_scene(m, d, ids))
    top = seen[0][-1].split()
    assert top[2] == "upright", seen  # the stack stands at t = 0 ...
    assert seen[1][-1].split()[-2:] == ["lying", "still"] or "hidden" in seen[1][-1], (
        seen
    )  # ... and lies at rest


@pytest.mark.parametrize("world_name", ["drop", "slide", "topple", "dominoes", "pendulum", "occluder"])
def test_scene_clips_never_name_an_order(world_name):
    from embodied.worlds import make_world

    world = make_world(world_name, 56, 56)
    for seed in range(3):
        frames, text, meta = make_scene_clip(world, seed, 4, difficulty="hard")
        assert frames.shape == (4, 56, 56, 3) and meta["order"] in ("forward", "reversed", "shuffled")
        words = set(text.replace(",", " ").replace(".", " ").replace(":", " ").split())
        assert not words & {"forward", "reversed", "backward", "shuffled", "before", "after", "first", "last"}
        assert text.count("frame ") == 4


def test_pretrain_rejects_unknown_worlds_and_odd_frame_counts(tmp_path):
    for bad, msg in (
        ("pretrain.scenes=[drop,moon]", "moon"),
        ("pretrain.num_frames=[3]", "even"),
        ("pretrain.tiny.vision_width=128", "vision_width"),
    ):
        cfg = load_config(overrides=[f"run_dir={tmp_path}", "pretrain.captions=scene", bad])
        with pytest.raises(ValueError, match=msg):
            pretrain(cfg, progress=False)


def test_the_every_world_base_was_built_by_its_config():
    path = resolve_policy_path("tiny-worlds")
    assert path == SHIPPED_WORLDS and (path / "model.safetensors").is_file()
    built = json.loads((path / "embodied_pretrain.json").read_text())
    want = dataclasses.asdict(load_config("configs/pretrain_worlds.yaml").pretrain)
    # built before issue 23 renamed `pretrain.worlds` (the kinds of scene) to `pretrain.scenes`
    built["pretrain"]["scenes"] = built["pretrain"].pop("worlds")
    built["pretrain"].setdefault("tiny", {})  # sizes of a from-scratch build, added later; empty here
    built["pretrain"].setdefault("vision_target", "occupancy")  # added later; what it was built with
    built["pretrain"].setdefault("architecture", "qwen2.5-vl")  # added later; what it was built with
    assert {k: v for k, v in built["pretrain"].items() if k not in ("workers", "out")} == {
        k: v for k, v in want.items() if k not in ("workers", "out")
    }, "configs/pretrain_worlds.yaml changed: rebuild with its command (docs/perception.md)"


@pytest.mark.slow
def test_pretrain_rebuilds_the_every_world_base(tmp_path):
    """`embodied pretrain -c configs/pretrain_worlds.yaml` reproduces the shipped `tiny-worlds` weights."""
    cfg = load_config("configs/pretrain_worlds.yaml", overrides=[f"run_dir={tmp_path}", "threads=2"])
    summary = pretrain(cfg, progress=False)
    new, shipped = (
        load_file(f"{summary['model']}/model.safetensors"),
        load_file(SHIPPED_WORLDS / "model.safetensors"),
    )
    worst = max((new[k] - shipped[k]).abs().max().item() for k in shipped)
    assert worst < 1e-4, f"rebuilt tiny-worlds differs from the shipped one by up to {worst}"
