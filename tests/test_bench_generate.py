"""`embodied bench generate` on a tiny run: real rendering, real workers, the JSON it promises."""

from __future__ import annotations

from embodied.bench import generate as bench
from embodied.config import Config


def test_bench_generate_reports_rates_and_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RAW_SECONDS", 0.3)  # shorter timing windows; the code path is the same
    cfg = Config()
    cfg.data.n_train, cfg.data.workers = 12, 1
    result = bench.run(cfg, tmp_path, progress=False)
    assert result["clips"] == 12 and result["skipped"] == 0
    assert result["frames_per_clip"] == 8 and result["resolution"] == [128, 128]
    assert set(result["per_clip_ms_one_process"]) >= {"reset", "record", "encode"}
    assert result["clips_per_s"] > 0 and result["raw_render_fps"] > 0
    ratio = result["clips_per_s"] * 8 / result["raw_render_fps"]
    assert abs(result["pipeline_vs_raw"] - round(ratio, 3)) < 2e-3  # one worker: the same per worker
    assert abs(result["pipeline_vs_raw_per_worker"] - round(ratio, 3)) < 2e-3
    t = bench.TARGETS
    assert result["targets"] == t
    assert result["meets_targets"] == (
        result["clips_per_s"] >= t["clips_per_s"] and result["pipeline_vs_raw"] >= t["pipeline_vs_raw"]
    )
    assert not (tmp_path / "bench_data").exists()  # the clips are deleted afterwards
    assert "main" in result["memory"] or result["memory"]["samples"] < 10
