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
from embodied.policy.tiny import SHIPPED
from embodied.run import pretrain
from embodied.tasks.caption import caption, colour_name
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


def test_caption_lists_objects_left_to_right_with_binned_heights():
    heights = np.array([[0.5, 0.01], [0.1, 0.29], [0.0, 0.3]])  # 3 frames x 2 objects (m above the floor)
    text = caption(["box", "sphere"], ["red", "blue"], heights, xs=np.array([0.4, -0.2]))
    assert text == (
        "2 objects: blue sphere, red box. frame 1: blue floor, red high. "
        "frame 2: blue low, red low. frame 3: blue high, red floor."
    )
    assert colour_name([0.9, 0.1, 0.1]) == "red" and colour_name([0.1, 0.2, 0.9]) == "blue"


def _tiny_run(tmp_path, name):
    cfg = load_config(
        overrides=[
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


def test_shipped_base_was_built_by_the_current_defaults():
    path = resolve_policy_path("tiny-base")
    assert path == SHIPPED and (path / "model.safetensors").is_file()
    built = json.loads((path / "embodied_pretrain.json").read_text())
    defaults = dataclasses.asdict(PretrainConfig())
    assert {k: v for k, v in built["pretrain"].items() if k != "workers"} == {
        k: v for k, v in defaults.items() if k != "workers"
    }, "the defaults changed: rebuild with `embodied pretrain pretrain.out=embodied/assets/tiny_base`"
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
