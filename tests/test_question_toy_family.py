"""A new question family is one file (issue 52): a toy family written into a temporary module and registered
is generated (simulated, in a spawned worker, and from footage), trained on for one SFT step and evaluated
through the commands' own functions, without a line of the framework naming it; and a module that misses
part of the protocol is refused with its name and what it lacks."""

from __future__ import annotations

import importlib.util
import json
import types

import numpy as np
import pytest

from embodied import envs, questions
from embodied.questions import protocol

TOY = '''
"""Negative: is the clip shown in its true colours or as a photographic negative?"""

import numpy as np

from embodied.questions import LETTERS, answer_text, reset_world, scene_meta

NAME = "negative"
VERSION = 1
QUESTION = "Is this video shown in its true colours or as a photographic negative?"
OPTIONS = ("true colours", "negative")


def num_options(tier, variant=""):
    return len(OPTIONS)


def _record(answer, meta):
    return {"family": NAME, "question": QUESTION, "options": list(OPTIONS), "answer": LETTERS[answer],
            "meta": meta}


def make(world, rng, answer, tier, fam, clip):
    info = reset_world(world, rng, tier)
    start = float(rng.uniform(*info["motion"]))
    frames = world.record(start + np.arange(2) / clip.fps)
    meta = {"fps": clip.fps, "num_frames": 2, "clip_start_s": round(start, 4), **scene_meta(fam.scene, info)}
    return _record(answer, meta), np.ascontiguousarray(255 - frames if answer == 1 else frames)


def from_frames(frames, fps, rng, answer, tier, fam):
    clip = frames[:2]
    shown = 255 - clip if answer == 1 else clip
    return _record(answer, {"fps": fps, "num_frames": 2}), np.ascontiguousarray(shown)


def footage_frames(tier, fam, clip):
    return 2


def verify(record, shown, original):
    return bool(np.array_equal(shown, 255 - original if answer_text(record) == "negative" else original))


def reasoning_for(record):
    return "Shadows are dark in true colours and light in a negative."


def trace_for(record):
    return answer_text(record)
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    path = tmp_path_factory.mktemp("toy_family") / "negative.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("negative", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    questions.register(module)
    yield module
    questions.unregister("negative")


def _config(root, run_dir, families: str, *extra: str):
    from embodied.config import load_config

    return load_config(
        None,
        [
            f"data.root={root}",
            f"data.families={families}",
            "data.sheets=false",
            f"run_dir={run_dir}",
            "policy.path=tiny",
            *extra,
        ],
    )


def test_registered_toy_is_a_family(toy):
    assert questions.family("negative") is toy and questions.is_family("negative")
    assert questions.family_names()[-1] == "negative"
    assert questions.FAMILIES == ("arrow_of_time", "spatial_puzzle", "temporal_puzzle", "object_permanence")
    assert not set(questions.family_names()) & set(envs.task_names())  # `schema.upgrade` relies on it
    # the hooks' defaults where the toy defines none, its own where it does
    assert questions.hook(toy, "NEEDS_MOTION") is False and questions.hook(toy, "phrases")() == ()
    assert questions.hook(toy, "VARIANTS") == ("",)
    assert questions.hook(questions.family("spatial_puzzle"), "VARIANTS")[0] == "arrangement"
    assert questions.hook(toy, "footage_frames")("easy", None, None) == 2
    answers = questions.hook(toy, "quickstart_answers")(5, np.random.default_rng(0))
    assert sorted(answers.tolist()) == [0, 0, 0, 1, 1]
    frames = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    record, shown = toy.from_frames(frames, 2.0, np.random.default_rng(0), 1, "easy", None)
    assert toy.verify(record, shown, frames) and not toy.verify(record | {"answer": "A"}, shown, frames)
    assert questions.option_orders(record) is None  # not an ordering question (the default hook)
    assert not questions.asks_orders("negative") and questions.asks_orders("temporal_puzzle")
    target = "<think>negative</think><answer>B</answer>"
    assert questions.sft_target(record | {"id": "x"}, "trace") == target


def test_protocol_is_checked_on_register_and_on_discovery(toy, tmp_path):
    with pytest.raises(TypeError, match=r"half is not a question family: it lacks \[.*'make'.*'trace_for'\]"):
        questions.register(types.ModuleType("half"))
    with pytest.raises(ValueError, match="already known"):
        questions.register(questions.family("spatial_puzzle"))
    twin = types.ModuleType("twin")
    twin.__dict__.update({k: v for k, v in vars(toy).items() if not k.startswith("__")})
    with pytest.raises(ValueError, match="'negative' is already known"):
        questions.register(twin)
    (tmp_path / "helper.py").write_text("X = 1\n")  # no NAME and no verify: not a family
    (tmp_path / "puzzle.py").write_text('NAME = "puzzle"\nVERSION = 1\n\ndef verify(r):\n    pass\n')
    with pytest.raises(ImportError, match=r"puzzle.py: a question family module must define \['num_options'"):
        protocol.discover(tmp_path)
    (tmp_path / "puzzle.py").write_text(TOY.replace('NAME = "negative"', 'NAME = "puzzle"'))
    with pytest.raises(ImportError, match="puzzle.py: a shipped question family needs RANK"):
        protocol.discover(tmp_path)
    (tmp_path / "puzzle.py").write_text(TOY.replace('NAME = "negative"', 'NAME = "puzzle"\nRANK = 0'))
    assert protocol.discover(tmp_path) == ("puzzle",)


def test_toy_generates_trains_one_step_and_evaluates(toy, tmp_path):
    from embodied import run
    from embodied.data.build import dataset_matches
    from embodied.data.load import load_records

    cfg = _config(
        tmp_path / "data",
        tmp_path / "run",
        "[{family: negative, scene: drop, tiers: [easy, hard]}]",
        "data.n_train=4",
        "data.n_val=0",
        "data.n_test=4",
        "data.workers=1",  # a spawned worker registers the toy again from its file
        "sft.steps=1",
        "sft.batch_size=2",
        "sft.eval_every=0",
        "sft.checkpoint_every=0",
        "eval.max_new_tokens=8",
    )
    made = run.generate(cfg, progress=False)
    assert made["counts"]["train"] == {"negative": {"easy": 2, "hard": 2}}
    assert dataset_matches(cfg.data)  # the toy's VERSION is in the manifest and is checked
    records = load_records(tmp_path / "data", "test")
    assert sorted(r["answer"] for r in records) == ["A", "A", "B", "B"]
    trained = run.sft(cfg, progress=False)
    assert trained["model"].endswith("model")
    cfg.policy.path = trained["model"]
    result = run.eval(cfg, progress=False)
    assert result["n"] == 4 and set(result["per_family"]) == {"negative"}
    assert result["chance"] == 0.5


def test_toy_from_footage(toy, tmp_path):
    from embodied.data.build import generate_dataset
    from embodied.video import write_video

    rng = np.random.default_rng(0)
    write_video(tmp_path / "videos" / "noise.mp4", rng.integers(0, 256, (6, 64, 64, 3), np.uint8), fps=2.0)
    cfg = _config(tmp_path / "data", tmp_path / "run", "[{family: negative, tiers: [easy]}]")
    cfg.data.from_videos = str(tmp_path / "videos")
    manifest = generate_dataset(cfg.data, progress=False)
    assert manifest["from_videos"]["windows"]["frames"] == 2  # the toy's footage_frames
    assert manifest["counts"]["train"] == {"negative": {"easy": 3}}  # 3 windows; NEEDS_MOTION defaults off
    record = json.loads((tmp_path / "data" / "train.jsonl").read_text().splitlines()[0])
    assert record["family"] == "negative" and record["meta"]["source"] == "noise.mp4"
