"""Issue 25's cuts change no result: the shortened physics at reset records the same frames, and the
decoded clips load the same from the thread pool."""

import numpy as np

from embodied.data.load import load_examples
from embodied.questions import arrow_of_time
from embodied.video import read_video


def test_reset_simulating_less_records_the_same_frames():
    from embodied.worlds import make_world

    world = make_world("drop", width=64, height=64)
    try:
        times = 0.2 + np.arange(4) / 2.0  # the last frame is past the shortened span: extended on demand
        for seed in (3, 11):
            world.reset(seed)
            full = world.record(times)
            world.reset(seed, simulate=0.5)
            short = world.record(times)
            assert np.array_equal(full, short)
    finally:
        world.close()


def test_make_example_is_unchanged_by_its_shortened_reset():
    from embodied.worlds import make_world

    world = make_world("drop", width=64, height=64)
    try:
        spec = arrow_of_time.ClipSpec()
        rec, frames = arrow_of_time.make_example(world, 77, True, spec)
        rng = np.random.default_rng(77)
        world.reset(rng)  # the whole horizon, as before the cut
        start = float(rng.uniform(0.0, spec.max_start))
        again = world.record(start + np.arange(spec.num_frames) / spec.fps)[::-1]
        assert rec["meta"]["clip_start_s"] == round(start, 4)
        assert np.array_equal(frames, again)
    finally:
        world.close()


def test_threaded_load_keeps_order_and_frames(examples, tmp_path):
    from embodied.data.engine import store

    root = tmp_path
    lines = []
    for i, e in enumerate(examples[:6]):
        rec = {k: v for k, v in e.record.items() if k not in ("id", "video")}
        full, _ = store(root, f"train-{i:06d}", "train", rec, e.clip.frames, e.clip.fps)
        lines.append(full)
    (root / "train.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in lines))
    loaded, skipped = load_examples(root, "train")
    assert not skipped and [x.record["id"] for x in loaded] == [r["id"] for r in lines]
    for x, r in zip(loaded, lines):
        assert np.array_equal(x.clip.frames, read_video(root / r["video"]).frames)


def test_bench_quickstart_needs_a_ref_and_checks_it_out(tmp_path):
    import subprocess
    from types import SimpleNamespace

    import pytest

    from embodied.bench import quickstart

    cfg = SimpleNamespace(bench=SimpleNamespace(against=""))
    with pytest.raises(ValueError, match="--against"):
        quickstart.run(cfg, tmp_path)
    path, sha = quickstart.worktree("HEAD", tmp_path)
    try:
        assert sha == quickstart.git("rev-parse", "HEAD")
        assert quickstart.git("rev-parse", "HEAD", cwd=path) == sha
        assert (path / "embodied" / "bench" / "quickstart.py").is_file()
        assert quickstart.worktree("HEAD", tmp_path) == (path, sha)  # reused, not added twice
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=quickstart.REPO, check=False)
