"""`report.html` of a real (tiny) quickstart run: its sections, the CLI, and a headless-Chromium check that
the page renders (screenshot under the test's tmp folder), every image loads and the console stays clean."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from embodied.report import build_report, write_report

CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser") if shutil.which(b)), None)
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def run_dir(tiny_policy, tmp_path_factory):
    """A tiny quickstart (real data, training and evaluations; ~20 s), plus rollout samples of its policy."""
    from embodied.cli import main

    root = tmp_path_factory.mktemp("report")
    out, data = root / "run", root / "data"
    args = ["quickstart", "-q", f"run_dir={out}", f"data.root={data}", "data.n_train=16", "data.n_val=4"]
    args += ["data.n_test=6", "data.workers=0", "sft.steps=6", "sft.batch_size=8", "sft.eval_every=0"]
    args += ["grpo.steps=2", "grpo.prompts_per_step=2", "grpo.group_size=4", "eval.max_new_tokens=16"]
    assert main(args) == 0
    _log_samples(out, data, tiny_policy)
    return out


def _log_samples(out: Path, data: Path, policy) -> None:
    """What the GRPO loop logs every `log.samples_every` steps: a real rollout of the test clips."""
    from embodied.data.load import load_examples
    from embodied.rl.rewards import mcq_rewards
    from embodied.rl.rollout import Sampling, sample_groups
    from embodied.train.metrics import MetricsLog
    from embodied.train.tracking import LogConfig, Tracking
    from embodied.video import VideoConfig

    examples, _ = load_examples(data, "test", limit=2)
    ro = sample_groups(
        *policy, examples, VideoConfig(), mcq_rewards(), Sampling(group_size=4, max_new_tokens=8)
    )
    MetricsLog(out / "metrics.jsonl", "grpo", Tracking(LogConfig(samples_every=1, samples=2))).log_rollout(
        2, ro
    )


def test_report_holds_every_section_with_inline_images(run_dir):
    page = write_report(run_dir).read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    for stage, acc in summary["accuracy"].items():  # accuracy and its interval, per stage
        lo, hi = summary["ci95"][stage]
        assert f"{acc:.3f} [{lo:.3f}, {hi:.3f}]" in page
    for name in ("Evaluation: initial", "Evaluation: sft", "Evaluation: grpo", "arrow_of_time", "easy"):
        assert name in page
    examples = json.loads((run_dir / "examples" / "examples.json").read_text())
    assert all(e["id"] in page for e in examples)
    assert page.count("data:image/gif;base64,") == len(examples)  # one animated strip per example
    assert "data:image/png;base64," in page and "Rollout samples" in page
    assert 'src="file:' not in page and 'src="http' not in page  # self-contained


def test_report_replots_curves_and_shows_env_videos_first_frames(run_dir, tmp_path):
    from embodied.video import write_video

    other = tmp_path / "run"
    other.mkdir()
    shutil.copy(run_dir / "metrics.jsonl", other / "metrics.jsonl")  # no curves.png: plotted from the rows
    frames = np.stack([np.full((32, 48, 3), 40 * t, np.uint8) for t in range(5)])
    write_video(other / "videos" / "sim_place_0.mp4", frames, fps=10.0)
    page = build_report(other)
    assert "training curves (from metrics.jsonl)" in page
    assert "sim_place_0 first" in page and "sim_place_0 last" in page
    assert "This folder holds no results yet" in build_report(tmp_path / "run" / "videos")


def test_report_cli(run_dir, capsys):
    from embodied.cli import main

    (run_dir / "report.html").unlink(missing_ok=True)
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.html").is_file() and str(run_dir) in capsys.readouterr().out
    assert main(["report", str(run_dir / "missing")]) == 1
    assert main(["report"]) == 2


def _browser_check(page: Path, screenshot: Path) -> dict:
    """Open `page` in headless Chromium: console errors, images that did not load, visible text, and a
    full-page screenshot's share of non-white pixels."""
    from PIL import Image
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    flags = "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-sync"
    flags += " --disable-background-networking --disable-component-update --window-size=1280,900"
    for flag in flags.split():
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={screenshot.parent / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.get(page.resolve().as_uri())
        broken = driver.execute_script(
            "return Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
            ".map(i => i.alt || i.src.slice(0, 40));"
        )
        text = driver.execute_script("return document.body.innerText.trim().length;")
        height = driver.execute_script("return document.body.scrollHeight;")
        driver.set_window_size(1280, min(max(height, 900), 16000))
        driver.save_screenshot(str(screenshot))
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    finally:
        driver.quit()
    pixels = np.asarray(Image.open(screenshot).convert("L"))
    return {"errors": errors, "broken": broken, "text": text, "ink": float((pixels < 235).mean())}


@pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="headless Chromium not found: install Debian's chromium and chromium-driver "
    "(scripts/setup.sh dev does, as root) to check report.html in a browser",
)
def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    pytest.importorskip("selenium", reason="selenium not installed (pip install -e '.[dev]')")
    shot = tmp_path / "report.png"
    seen = _browser_check(write_report(run_dir), shot)
    print(f"screenshot: {shot}")
    assert seen["errors"] == [] and seen["broken"] == []
    assert seen["text"] > 500 and seen["ink"] > 0.02, seen  # not a blank page

    # The same checks catch a broken page: a missing image and a script error.
    bad = tmp_path / "bad" / "report.html"
    bad.parent.mkdir()
    bad.write_text(
        (run_dir / "report.html")
        .read_text()
        .replace("</body>", "<img src='missing.png' alt='gone'><script>undefinedCall()</script></body>")
    )
    seen = _browser_check(bad, tmp_path / "bad.png")
    assert seen["broken"] == ["gone"] and any("undefinedCall" in e for e in seen["errors"]), seen


def test_report_leads_with_stage_accuracy_reward_and_held_out_and_folds_constant_panels(run_dir):
    from embodied.report import constant_metrics
    from embodied.train.metrics import read_metrics

    page = build_report(run_dir)
    order = [
        page.index(h) for h in ("<h2>Summary", "<h2>Reward and held-out", "<h2>Evaluations", "<h2>Curves")
    ]
    assert order == sorted(order)  # what matters first
    rows = read_metrics(run_dir / "metrics.jsonl")
    constant = constant_metrics(rows)
    assert all(len({r[k] for r in rows if k in r}) == 1 for k in constant)  # truly one value, logged twice+
    if constant:
        line = page[page.index("Constant for the whole run") :].split("</p>", 1)[0]
        assert all(k in line for k in constant)
    fake = [{"stage": "grpo", "step": s, "clip/fraction": 0.0, "reward/accuracy": s / 4} for s in (1, 2, 3)]
    assert constant_metrics(fake) == {"clip/fraction": 0.0}
