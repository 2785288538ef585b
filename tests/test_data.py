"""Datasets on disk: real MuJoCo clips, real mp4 files, the JSONL format, loading and its failures.

Generation renders real clips (~20 clips/s on 2 cores), so the sizes here are small: one 20-clip
dataset per module, one identical regeneration, one tiny dataset with another seed.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from embodied.data.build import generate_dataset
from embodied.data.load import load_examples, load_records
from embodied.data.schema import SPLITS, DataConfig, split_seeds
from embodied.video import read_video

SIZES = {"train": 10, "val": 4, "test": 6}


def _cfg(root, seed=0, sizes=SIZES) -> DataConfig:
    return DataConfig(
        root=str(root), seed=seed, n_train=sizes["train"], n_val=sizes["val"], n_test=sizes["test"], workers=0
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds_a")
    manifest = generate_dataset(_cfg(root), progress=False)
    return root, manifest


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_files_and_manifest(dataset):
    root, manifest = dataset
    on_disk = json.loads((root / "manifest.json").read_text())
    assert on_disk["counts"] == manifest["counts"]
    for split, n in SIZES.items():
        assert on_disk["counts"][split] == {"arrow_of_time": {"easy": n}}
        records = _jsonl(root / f"{split}.jsonl")
        assert len(records) == n
        assert len({r["id"] for r in records}) == n
        for r in records:
            assert set(r) >= {"id", "family", "video", "question", "options", "answer", "meta"}
            assert r["id"].startswith(f"{split}-")
            assert r["video"] == f"videos/{split}/{r['id']}.mp4"  # relative to the root
            assert (root / r["video"]).is_file()
            assert r["answer"] == "AB"[r["options"].index(r["meta"]["direction"])]
    # No stray videos beyond the records.
    assert sum(1 for _ in (root / "videos").rglob("*.mp4")) == sum(SIZES.values())


def test_answers_balanced_per_split(dataset):
    root, manifest = dataset
    for split, n in SIZES.items():
        answers = [r["answer"] for r in _jsonl(root / f"{split}.jsonl")]
        assert answers.count("A") == answers.count("B") == n // 2, (split, answers)
        assert manifest["answers"][split] == {"arrow_of_time": {"easy": {"A": n // 2, "B": n // 2}}}


def test_split_seeds_disjoint_and_recorded(dataset):
    root, _ = dataset
    seeds = {s: split_seeds(0, s, n) for s, n in SIZES.items()}
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not set(seeds[a]) & set(seeds[b]), (a, b)
        assert [r["meta"]["seed"] for r in _jsonl(root / f"{a}.jsonl")] == seeds[a]
    assert split_seeds(0, "train", 10) == seeds["train"]  # reproducible
    assert split_seeds(0, "train", 3) == seeds["train"][:3]  # a bigger split extends, not reshuffles
    assert split_seeds(1, "train", 10) != seeds["train"]


def test_generation_is_deterministic(dataset, tmp_path):
    root_a, _ = dataset
    root_b = tmp_path / "ds_b"
    generate_dataset(_cfg(root_b), progress=False)
    for split in SIZES:
        assert (root_a / f"{split}.jsonl").read_text() == (root_b / f"{split}.jsonl").read_text()
        for r in _jsonl(root_a / f"{split}.jsonl"):
            fa = read_video(root_a / r["video"]).frames
            fb = read_video(root_b / r["video"]).frames
            assert np.array_equal(fa, fb), r["id"]


def test_other_seed_gives_other_records(dataset, tmp_path):
    root_a, _ = dataset
    root_c = tmp_path / "ds_c"
    generate_dataset(_cfg(root_c, seed=1, sizes={"train": 2, "val": 0, "test": 0}), progress=False)
    a = _jsonl(root_a / "train.jsonl")[:2]
    c = _jsonl(root_c / "train.jsonl")
    assert len(c) == 2
    for ra, rc in zip(a, c):
        assert ra["meta"]["seed"] != rc["meta"]["seed"]
        assert ra["meta"]["scene"] != rc["meta"]["scene"]
        assert not np.array_equal(
            read_video(root_a / ra["video"]).frames, read_video(root_c / rc["video"]).frames
        )


def test_reversed_clip_is_same_frames_reversed():
    from embodied.questions.arrow_of_time import ClipSpec, make_example
    from embodied.worlds import DropWorld

    world = DropWorld(112, 112)
    try:
        spec = ClipSpec()
        rec_f, fwd = make_example(world, 1234, False, spec)
        rec_r, rev = make_example(world, 1234, True, spec)
    finally:
        world.close()
    assert fwd.shape == (spec.num_frames, 112, 112, 3) and fwd.dtype == np.uint8
    assert np.array_equal(rev, fwd[::-1])
    assert not np.array_equal(fwd, fwd[::-1])  # the clip moves, so the check above means something
    assert rec_f["answer"] == "A" and rec_r["answer"] == "B"
    assert rec_f["meta"]["clip_start_s"] == rec_r["meta"]["clip_start_s"]
    assert rec_f["meta"]["scene"] == rec_r["meta"]["scene"]


def test_load_examples_skips_bad_videos(dataset, tmp_path):
    root = tmp_path / "ds_bad"
    shutil.copytree(dataset[0], root)
    records = _jsonl(root / "val.jsonl")
    garbage, gone = root / records[1]["video"], root / records[2]["video"]
    garbage.write_bytes(np.random.default_rng(0).bytes(3000))
    gone.unlink()
    with pytest.warns(UserWarning, match="2 of 4"):
        examples, skipped = load_examples(root, "val")
    assert [e.record["id"] for e in examples] == [records[0]["id"], records[3]["id"]]
    assert all(e.clip.frames.shape == (4, 112, 112, 3) and e.clip.fps == 2.0 for e in examples)
    assert len(skipped) == 2
    assert str(garbage) in skipped[0] and str(gone) in skipped[1]


def test_load_examples_clean(dataset):
    root, _ = dataset
    examples, skipped = load_examples(root, "test", limit=3)
    assert skipped == [] and len(examples) == 3


def test_load_records_bad_json_names_line(dataset, tmp_path):
    root = tmp_path / "ds_json"
    root.mkdir()
    lines = (dataset[0] / "val.jsonl").read_text().splitlines()
    lines[2] = lines[2][:-5]  # cut the closing of the third record
    (root / "val.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"val\.jsonl:3\b"):
        load_records(root, "val")


def test_load_records_missing_field_and_split(dataset, tmp_path):
    root = tmp_path / "ds_field"
    root.mkdir()
    recs = _jsonl(dataset[0] / "val.jsonl")
    del recs[1]["answer"]
    (root / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(ValueError, match=r"val\.jsonl:2: .*answer"):
        load_records(root, "val")
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        load_records(root, "train")


def test_a_dataset_written_before_the_family_key_loads_as_today(dataset, tmp_path):
    """Format 1 named a question's family `task` (issue 23 renamed it `family`): such a dataset loads with
    the same records, in the same key order, and the same clips; an interactive episode keeps `task`."""
    root = tmp_path / "ds_v1"
    shutil.copytree(dataset[0], root)
    for split in SIZES:
        new = _jsonl(dataset[0] / f"{split}.jsonl")
        old = [{("task" if k == "family" else k): v for k, v in r.items()} for r in new]
        assert all("family" not in r and r["task"] == "arrow_of_time" for r in old)
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
        loaded = load_records(root, split)
        assert loaded == new and [list(r) for r in loaded] == [list(r) for r in new]
    now, _ = load_examples(dataset[0], "test")
    then, skipped = load_examples(root, "test")
    assert skipped == [] and [e.record for e in then] == [e.record for e in now]
    assert all(np.array_equal(a.clip.frames, b.clip.frames) for a, b in zip(then, now))
    episode = {"id": "test-place-00000", "task": "place", "video": "v.mp4", "question": "q", "options": []}
    (root / "val.jsonl").write_text(json.dumps(episode | {"answer": ""}) + "\n")
    assert load_records(root, "val") == [episode | {"answer": ""}]  # an interactive task stays a task
    (root / "val.jsonl").write_text(json.dumps({k: v for k, v in episode.items() if k != "task"}) + "\n")
    with pytest.raises(ValueError, match=r"val\.jsonl:1: record lacks .*family \(or task\)"):
        load_records(root, "val")


def test_manifest_says_format_2_and_the_families(dataset):
    _, manifest = dataset
    assert manifest["format_version"] == 2 and manifest["kinds"] == ["arrow_of_time"]


def test_hf_datasets_loads_jsonl(dataset):
    hf = pytest.importorskip("datasets")
    root, _ = dataset
    ds = hf.load_dataset(
        "json", data_files=str(root / "train.jsonl"), split="train", cache_dir=str(root / ".hf_cache")
    )
    assert ds.num_rows == SIZES["train"]
    assert ds[0]["id"] == _jsonl(root / "train.jsonl")[0]["id"]
    assert sorted(ds["answer"]) == sorted(r["answer"] for r in _jsonl(root / "train.jsonl"))
