"""The benchmarks' measuring parts on real processes and files (the full runs are `-m slow`)."""

import sys

import numpy as np
import pytest

from embodied.bench.config import BenchRun
from embodied.bench.memory import measure
from embodied.bench.video import bench_file
from embodied.config import load_config
from embodied.video import write_video


def test_memory_measure_sees_the_child_peak(tmp_path):
    # The child touches 300 MB, frees it, then idles: the peak must still show it.
    code = "import numpy as np, time; a = np.ones(300 * 2**20 // 8); del a; time.sleep(0.3)"
    r = measure([sys.executable, "-c", code], tmp_path / "log.txt")
    assert r["returncode"] == 0
    # no upper bound: Linux may count pages the child shared with this (large) test process before exec
    assert r["main_process_peak_rss_mb"] >= 300
    assert r["wall_s"] > 0.3


def test_memory_measure_reports_a_failing_child(tmp_path):
    r = measure([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], tmp_path / "log.txt")
    assert r["returncode"] == 3
    assert "boom" in (tmp_path / "log.txt").read_text()


def test_video_bench_samples_the_same_frames_as_read_video(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "v.mp4"
    write_video(path, rng.integers(0, 256, (60, 64, 96, 3), dtype=np.uint8), 30.0)  # 2 s at 30 fps
    r = bench_file(path, fps=2.0, max_frames=32, repeats=2)
    assert r["size"] == "96x64" and r["src_frames"] == 60
    ours = r["readers"]["embodied"]
    assert ours["frames"] == 4 and ours["frames_per_s"] > 0
    qwen = r["readers"]["qwen_reader"]
    if "error" not in qwen:  # needs decord or torchcodec (extra `bench`)
        assert qwen["frames"] == ours["frames"]
        assert r["speedup"]["embodied_over_qwen_reader"] > 0


@pytest.mark.slow
def test_grpo_vs_trl_runs_both_and_reports_a_ratio(tmp_path):
    pytest.importorskip("trl")
    from embodied.bench.grpo_vs_trl import WORKLOAD, run

    settings = ["bench.prompts=4", "bench.rounds=1", "bench.steps=1", "threads=1"]  # the bench fixes the rest
    cfg = load_config(None, [*settings, "bench.trl_policies=[tiny:qwen3-vl]"], schema=BenchRun)
    r = run(cfg, tmp_path, progress=False)
    for rep in (r, r["side_by_side"]["tiny:qwen3-vl"]):  # the Qwen3-VL blocks ran in the same round
        tokens = rep["settings"]["prompt_tokens"]
        assert tokens["trl_images"] == tokens["ours_images"]
        for c in ("trl_images", "ours_images", "ours_video"):
            assert rep["contenders"][c]["s_per_step"]["n"] == 1
            assert 1 <= rep["contenders"][c]["completion_len_mean"] <= WORKLOAD["max_new_tokens"]
        assert rep["ratio"]["ours_images_over_trl_median"] > 0


def test_sft_bench_times_both_contenders_and_counts_the_padding_it_skips(tmp_path):
    from embodied.bench.sft import run

    root = tmp_path / "data"
    cfg = load_config(
        None,
        [
            f"data.root={root}",
            "data.n_train=8",
            "data.n_val=2",
            "data.n_test=2",
            "sft.batch_size=4",
            "bench.rounds=2",
            "bench.steps=1",
            "bench.warmup=0",
            "bench.sft_micro_batch=2",
            "threads=1",
        ],
        schema=BenchRun,
    )
    r = run(cfg, tmp_path, progress=False)
    whole, micro = r["contenders"]["whole batch"], r["contenders"]["micro-batches of 2"]
    assert whole["steps_timed"] == micro["steps_timed"] == 2
    assert whole["median_s_per_step"] > 0 and micro["median_s_per_step"] > 0 and r["speedup"] > 0
    # never more positions than the whole batch's; fewer where the prompts differ in length
    assert 0 < micro["prompt_positions_first_batch"] <= whole["prompt_positions_first_batch"]


def test_rollout_bench_without_vllm_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """`embodied bench rollout` where vLLM is not installed (the main `.venv`): one line naming the setup
    script and the environment that runs it, before any model loads."""
    from embodied.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, as in `.venv`
    assert main(["bench", "rollout", f"run_dir={tmp_path}", "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert "scripts/setup_vllm.sh, then .venv-vllm/bin/embodied bench rollout" in err
    assert len(err.splitlines()) == 1, err
    assert main(["bench", "rollout", "bench.rollout_engines=[hf, hf]", f"run_dir={tmp_path}", "-q"]) == 1
    assert "name each engine once" in capsys.readouterr().err
