"""`embodied export --format lmms-eval` on real generated data: a fresh benchmark (`data.benchmark=true`) and
a push-episode root written as lmms-eval task folders, their hooks scoring as `embodied eval` scores.

The first test runs by default (no lmms-eval needed: the hooks are this framework's code). The others (marker
`lmms_eval`) run lmms-eval 0.7.3 itself in `.venv-lmms` (scripts/setup_lmms_eval.sh): its own task manager on
both exports, and a whole `lmms-eval` run through its OpenAI-compatible backend against a real `transformers
serve` on 127.0.0.1, compared question by question and episode by episode with `embodied eval
eval.endpoint=...` against the same server.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from embodied.cli import main
from embodied.data.load import load_records
from embodied.envs import answer_form, push, task
from embodied.envs.reward import env_reward
from embodied.questions import LETTERS, FamilySpec, format_question
from embodied.video import read_video

ROOT = Path(__file__).parents[1]
LMMS_PYTHON = ROOT / ".venv-lmms" / "bin" / "python"
FAMILIES = [
    FamilySpec(family="arrow_of_time"),
    FamilySpec(family="temporal_puzzle"),
    FamilySpec(family="spatial_puzzle"),
]


def _benchmark(root: Path, families: list[FamilySpec], n: int) -> Path:
    """A fresh benchmark (`data.benchmark=true`: one `test` split from the benchmark seed stream)."""
    from embodied.data.build import generate_dataset
    from embodied.data.schema import DataConfig

    data = DataConfig(root=str(root), workers=0, families=families, sheets=False, benchmark=True)
    data.n_train, data.n_val, data.n_test = 0, 0, n
    generate_dataset(data, progress=False)
    return root


def _push(root: Path, n_train: int, n_test: int) -> Path:
    """Push episodes at 56 px (train and test splits)."""
    from embodied.data.episodes import generate_episodes
    from embodied.envs.config import EnvConfig

    env = EnvConfig(root=str(root), tasks=["push"], n_train=n_train, n_test=n_test, width=56, height=56)
    generate_episodes(env, progress=False)
    return root


class _Loader(yaml.SafeLoader):
    """Reads lmms-eval's `!function module.name` as the string `module.name` (lmms-eval imports it)."""


_Loader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


def _hooks(folder: Path):
    spec = importlib.util.spec_from_file_location(f"hooks_{folder.name}", folder / "embodied_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _export(root: Path, out: Path, capsys, *overrides: str) -> dict:
    args = ["export", "--format", "lmms-eval", f"data.root={root}", f"run_dir={out}", "-q", *overrides]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def _aggregate(hooks, folder: Path, task: str, rows: dict[str, list]) -> dict[str, float]:
    """Each metric of `task`'s YAML aggregated by the function the YAML names."""
    config = yaml.load((folder / f"{task}.yaml").read_text(), Loader=_Loader)
    out = {}
    for m in config["metric_list"]:
        fn = getattr(hooks, m["aggregation"].split(".", 1)[1])
        out[m["metric"]] = fn(rows[m["metric"]])
    return out


def test_export_writes_tasks_whose_hooks_show_and_score_as_embodied_eval(tmp_path, capsys):
    """The folder's YAML (task per family, group, content hash), and its hooks on real records: the sampled
    frames, the question text, a known answer scored by the parser and metrics, a push answer executed."""
    bench = _benchmark(tmp_path / "bench", [FamilySpec(family="arrow_of_time")], 4)
    summary = _export(bench, tmp_path / "out", capsys)
    out, digest = (
        tmp_path / "out",
        json.loads((bench / "manifest.json").read_text())["content_hash"]["sha256"],
    )
    assert summary["tasks"] == {"embodied_arrow_of_time": 4} and summary["content_hash"] == digest
    group = yaml.load((out / "embodied.yaml").read_text(), Loader=_Loader)
    task = yaml.load((out / "embodied_arrow_of_time.yaml").read_text(), Loader=_Loader)
    assert group["task"] == ["embodied_arrow_of_time"] and group["metadata"]["content_hash"] == digest
    assert task["metadata"]["content_hash"] == digest and task["metadata"]["benchmark"] is True
    assert task["process_results"] == "!function embodied_hooks.process_results"
    assert [m["metric"] for m in task["metric_list"]] == [
        "accuracy_all", "chance_all", "unparseable", "failed", "accuracy_easy", "chance_easy"
    ]  # fmt: skip
    hooks = _hooks(out)
    docs = [json.loads(line) for line in (out / "docs" / "arrow_of_time.jsonl").read_text().splitlines()]
    rows: dict[str, list] = {}
    for i, (doc, rec) in enumerate(zip(docs, load_records(bench, "test"))):
        frames = np.stack([np.asarray(im) for im in hooks.doc_to_visual(doc)])
        assert np.array_equal(frames, read_video(bench / rec["video"]).frames)  # 2 fps, same pixels
        assert hooks.doc_to_text(doc) == format_question(rec["question"], rec["options"])
        wrong = next(x for x in LETTERS[:2] if x != rec["answer"])
        answer = ["<think>so</think><answer>{}</answer>".format(rec["answer"]), f"<answer>{wrong}</answer>"]
        result = hooks.process_results(doc, [answer[i % 2] if i < 3 else "no idea"])
        for name, row in result.items():
            rows.setdefault(name, []).append(row)
    got = _aggregate(hooks, out, "embodied_arrow_of_time", rows)
    want = {"accuracy_all": 0.5, "chance_all": 0.5, "unparseable": 0.25, "failed": 0.0}
    assert got == want | {"accuracy_easy": 0.5, "chance_easy": 0.5}  # right, wrong, right, unparseable
    lost = hooks.process_results(doc, ["[LMMS_EVAL_REQUEST_FAILED after 5 retries] Connection refused"])
    rows = {name: [*rows[name], row] for name, row in lost.items()}  # listed, never scored as wrong
    assert _aggregate(hooks, out, "embodied_arrow_of_time", rows) == want | {
        "failed": 0.2, "accuracy_easy": 0.5, "chance_easy": 0.5
    }  # fmt: skip

    bare = tmp_path / "bare"  # records without their manifest: no content hash to name, refused in one line
    bare.mkdir()
    (bare / "test.jsonl").write_text((bench / "test.jsonl").read_text())
    assert (
        main(["export", "--format", "lmms-eval", f"data.root={bare}", f"run_dir={tmp_path / 'x'}", "-q"]) == 1
    )
    assert "no manifest with a content_hash" in capsys.readouterr().err

    episodes = _push(tmp_path / "env", 0, 2)
    _export(episodes, tmp_path / "env_out", capsys, "export.name=physics", "env.answer=number")
    hooks = _hooks(tmp_path / "env_out")
    doc = json.loads((tmp_path / "env_out" / "docs" / "push.jsonl").read_text().splitlines()[0])
    rec = answer_form(load_records(episodes, "test")[0], "number")
    good = f"<think>ok</think><answer>{push.good_action(rec):.3f}</answer>"
    row = hooks.process_results(doc, [good])["success"]
    assert row["terms"] == env_reward([good], [rec])[0] and row["terms"]["reward/success"] == 1.0
    assert hooks.episode_success([row]) == 1.0 and hooks.episode_simulate_s([row]) > 0


# --- lmms-eval itself (marker lmms_eval, .venv-lmms) ------------------------------------------------------


def _need_lmms() -> None:
    if not LMMS_PYTHON.is_file():
        pytest.skip("no .venv-lmms: run scripts/setup_lmms_eval.sh (lmms-eval pins av<16 and wandb==0.25)")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A fresh 3-family benchmark (8 questions a family), push episodes (6 train, 6 test) and 2 test episodes
    of each interactive task, exported as task folders under one include path (groups `bench`, `physics`,
    `physics3`)."""
    from embodied.config import Config
    from embodied.data.episodes import generate_episodes
    from embodied.envs.config import EnvConfig
    from embodied.run import export

    base = tmp_path_factory.mktemp("lmms")
    bench = _benchmark(base / "bench", FAMILIES, 24)
    episodes = _push(base / "env", 6, 6)
    tasks3 = EnvConfig(root=str(base / "env3"), tasks=["place", "carry", "push"], n_train=0, n_test=2)
    generate_episodes(tasks3, progress=False)
    for root, name in ((bench, "bench"), (episodes, "physics"), (base / "env3", "physics3")):
        cfg = Config()
        cfg.data.root, cfg.export.format, cfg.export.name = str(root), "lmms-eval", name
        cfg.export.out = str(base / "tasks" / name)
        export(cfg)
    return {"bench": bench, "env": episodes, "env3": base / "env3", "tasks": base / "tasks"}


def _frames_digest(path: Path) -> str:
    frames = np.ascontiguousarray(read_video(path).frames)
    return hashlib.sha256(frames.tobytes()).hexdigest()


@pytest.mark.lmms_eval
def test_lmms_eval_task_manager_loads_both_exports(exported, tmp_path):
    """lmms-eval 0.7.3's TaskManager (`--include_path`) indexes both groups and builds every task (chat type,
    as its OpenAI backend asks): the documents, the content hash, and each request's parts: the frames
    `embodied eval` samples (decoded in .venv-lmms with its own PyAV, digest equal), then the question."""
    _need_lmms()
    rng = np.random.default_rng(0)
    three = [answer_form(r, "number") for r in load_records(exported["env3"], "test")]
    answers = {
        r["id"]: f"<think>hm</think><answer>{task(r['task']).random_answer(rng)}</answer>" for r in three
    }
    spec = {"include_paths": [str(exported["tasks"])], "groups": ["bench", "physics", "physics3"]}
    spec["answers"] = answers
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    check = Path(__file__).with_name("lmms_env_check.py")
    proc = subprocess.run(
        [str(LMMS_PYTHON), str(check), str(tmp_path / "spec.json")],
        capture_output=True, text=True, timeout=600, env=_offline_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["lmms_eval"] == "0.7.3" and all(report["indexed"].values()) and len(report["indexed"]) == 3
    for group, root in (
        ("bench", exported["bench"]),
        ("physics", exported["env"]),
        ("physics3", exported["env3"]),
    ):
        digest = json.loads((root / "manifest.json").read_text())["content_hash"]["sha256"]
        records = {r["id"]: r for r in load_records(root, "test")}
        tasks = report["groups"][group]
        assert sum(len(t["docs"]) for t in tasks.values()) == len(records)
        for name, config in tasks.items():
            assert config["metadata"]["content_hash"] == digest, name
            gen = config["generation_kwargs"]
            assert gen["max_new_tokens"] == 48 and gen["do_sample"] is False and gen["temperature"] == 0
            for rid, request in config["docs"].items():
                rec = records[rid] if group == "bench" else answer_form(records[rid], "number")
                clip = read_video(root / rec["video"])
                assert request["order"] == ["image"] * len(clip.frames) + ["text"]
                assert request["size"] == list(clip.frames.shape[1:3])
                assert request["text"] == [format_question(rec["question"], rec["options"])]
                assert request["frames_sha256"] == _frames_digest(root / rec["video"]), rid
    assert set(report["groups"]["bench"]) == {f"bench_{f.family}" for f in FAMILIES}
    tasks3 = report["groups"]["physics3"]
    assert set(tasks3) == {"physics3_place", "physics3_carry", "physics3_push"}
    for r in three:  # lmms-eval's process_results ran our hook: the answer parsed and executed in MuJoCo
        (name,) = [t for t in tasks3 if r["id"] in tasks3[t]["scored"]]
        scored = tasks3[name]["scored"][r["id"]]
        assert set(scored) == set(tasks3[name]["metrics"]) and scored["success"]["task"] == r["task"]
        assert scored["success"]["terms"] == env_reward([answers[r["id"]]], [r])[0], r["id"]
    assert "success" in report["groups"]["physics"]["physics_push"]["metrics"]


def _offline_env() -> dict:
    return os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


class Server:
    """`transformers serve FOLDER` on a free 127.0.0.1 port, started and killed by the test."""

    def __init__(self, folder: Path, log: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        exe = Path(sys.executable).parent / "transformers"
        cmd = [
            str(exe),
            "serve",
            str(folder),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--device",
            "cpu",
        ]
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=log.open("a"), stderr=subprocess.STDOUT, env=_offline_env())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"transformers serve exited: {log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=1) as r:
                    self.model = json.loads(r.read())["data"][0]["id"]
                    return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"transformers serve did not come up: {log.read_text()[-2000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(exported, tmp_path_factory):
    """The tiny base after 150 SFT steps (frames shown as images, the form the server takes) towards answers
    that parse and differ: each question's last option letter (B, C or D by family) and each push train
    episode's good impulse (the model settles on one). Its skill is not the point: the test compares two
    harnesses on the same served answers."""
    from embodied.config import SFTConfig
    from embodied.data.load import Example, load_split
    from embodied.eval.answerer import as_images
    from embodied.policy.model import load_policy, save_policy
    from embodied.policy.tiny import SHIPPED
    from embodied.train.sft import train_sft
    from embodied.train.state import Run
    from embodied.video import VideoConfig

    out = tmp_path_factory.mktemp("served")
    model, processor = load_policy(SHIPPED)
    questions = load_split(exported["bench"], "test", VideoConfig())
    train = questions + load_split(exported["env"], "train", VideoConfig()) * 4  # 24 questions, 24 pushes
    train = [Example(as_images(e.record, e.clip), e.clip) for e in train]

    def target(r: dict) -> str:
        answer = f"{push.good_action(r):.2f}" if r.get("task") == "push" else LETTERS[len(r["options"]) - 1]
        return f"<think></think><answer>{answer}</answer>"

    cfg = SFTConfig(steps=150, batch_size=2, lr=5e-3, eval_every=0, checkpoint_every=0, warmup_steps=0)
    train_sft(cfg, Run(model, processor, train, out / "sft", progress=False), target_fn=target)
    save_policy(model, processor, out / "model")
    s = Server(out / "model", out / "server.log")
    yield s
    s.kill()


def _embodied_eval(root: Path, url: str, run_dir: Path) -> dict:
    """`embodied eval data.root=ROOT eval.endpoint=URL` (the defaults otherwise); its `eval_test.json`."""
    from embodied.config import Config
    from embodied.run import eval as run_eval

    cfg = Config()
    cfg.run_dir, cfg.data.root, cfg.threads, cfg.eval.endpoint = str(run_dir), str(root), 1, url
    run_eval(cfg, False)
    return json.loads((run_dir / "eval_test.json").read_text())


def _lmms_eval(server: Server, tasks: Path, out: Path) -> tuple[dict, dict[str, dict]]:
    """`lmms-eval --model openai` on both groups: its results JSON and the logged row of every document."""
    args = f"model={server.model},base_url={server.url},num_concurrent=4,max_retries=1,timeout=120"
    cmd = [str(LMMS_PYTHON), "-m", "lmms_eval", "--model", "openai", "--model_args", args, "--tasks"]
    cmd += ["bench,physics", "--include_path", str(tasks), "--log_samples", "--output_path", str(out)]
    env = _offline_env() | {"OPENAI_API_KEY": "EMPTY"}  # the client wants one; the server checks none
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=out.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (results,) = out.rglob("*_results.json")
    rows = {}
    for path in out.rglob("*_samples_*.jsonl"):
        for line in path.read_text().splitlines():
            sample = json.loads(line)
            row = sample.get("accuracy_all") or sample["success"]
            rows[row["id"]] = row | {"lmms_response": sample["filtered_resps"]}
    return json.loads(results.read_text()), rows


@pytest.mark.lmms_eval
def test_lmms_eval_through_transformers_serve_reproduces_embodied_eval(exported, server, tmp_path):
    """The same served model, the same split: lmms-eval's OpenAI backend on the exported tasks and `embodied
    eval eval.endpoint=...` give the same prediction for every question, the same accuracy (overall, per
    family and tier, chance beside it), and on push episodes the same executed outcome per episode and the
    same success."""
    _need_lmms()
    mcq = _embodied_eval(exported["bench"], server.url, tmp_path / "eval_bench")
    env = _embodied_eval(exported["env"], server.url, tmp_path / "eval_env")
    t0 = time.perf_counter()
    results, rows = _lmms_eval(server, exported["tasks"], tmp_path / "lmms")
    lmms_s = time.perf_counter() - t0
    got = results["results"]

    ours = {p["id"]: p for p in mcq["predictions"]}
    same = [qid for qid, p in ours.items() if rows[qid]["predicted"] == p["predicted"]]
    assert len(same) == len(ours) == 24, [
        (q, rows[q]["response"], ours[q]["response"]) for q in ours if q not in same
    ]
    assert len({p["predicted"] for p in ours.values()}) > 1, "the served answers should vary"
    assert got["bench"]["accuracy_all,none"] == pytest.approx(mcq["accuracy"], abs=1e-12)
    assert got["bench"]["chance_all,none"] == pytest.approx(mcq["chance"], abs=1e-12)
    assert got["bench"]["unparseable,none"] == pytest.approx(mcq["unparseable"], abs=1e-12)
    for family, tiers in mcq["per_family_tier"].items():
        task = got[f"bench_{family}"]
        assert task["accuracy_all,none"] == pytest.approx(mcq["per_family"][family]["accuracy"], abs=1e-12)
        for tier, s in tiers.items():
            assert task[f"accuracy_{tier},none"] == pytest.approx(s["accuracy"], abs=1e-12)
            assert task[f"chance_{tier},none"] == pytest.approx(s["chance"], abs=1e-12)

    episodes = {p["id"]: p for p in env["predictions"]}
    assert len(episodes) == 6
    for eid, p in episodes.items():  # the same answer, executed to the same outcome
        mine = rows[eid]["terms"]
        physics = lambda t: {k: v for k, v in t.items() if k not in ("reward/format", "reward/total")}  # noqa: E731
        assert physics(mine) == physics(p["terms"]), (eid, rows[eid]["response"], p["response"])
    assert got["physics"]["success,none"] == pytest.approx(env["success"], abs=1e-12)
    ms = [round(rows[e]["seconds"] * 1000) for e in sorted(episodes)]
    texts_equal = sum(rows[q]["response"].strip() == ours[q]["response"].strip() for q in ours)
    print(
        f"lmms-eval vs embodied eval: predictions {len(same)}/{len(ours)} equal, accuracy "
        f"{got['bench']['accuracy_all,none']:.3f} / {mcq['accuracy']:.3f} (chance {mcq['chance']:.3f}), "
        f"responses equal {texts_equal}/{len(ours)}; push success {got['physics']['success,none']:.3f} / "
        f"{env['success']:.3f} on {len(episodes)}; MuJoCo in the hook {ms} ms per episode in order "
        f"(mean {got['physics_push']['simulate_s,none'] * 1000:.0f}); lmms-eval run {lmms_s:.1f} s"
    )


@pytest.mark.lmms_eval
@pytest.mark.parametrize("size", [(112, 112), (128, 128), (120, 160), (200, 300), (40, 40)])
def test_frames_carry_the_pixel_budget_the_server_is_not_sent(size):
    """lmms-eval's OpenAI backend cannot send `chat_template_kwargs.processor_kwargs`: the hook's frames, run
    through the served Qwen processor at its defaults, give the pixel values `embodied eval`'s frames give
    under the budget it sends (bit for bit), whether or not the frames needed resizing."""
    from PIL import Image
    from transformers import AutoProcessor

    from embodied.integrations.lmms_eval import TaskSettings, budget_frames
    from embodied.policy.tiny import SHIPPED
    from embodied.video import VideoConfig, frame_pixel_cap

    v = VideoConfig()
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (4, 24, 32, 3), dtype=np.uint8)  # smooth-ish content, then resized
    frames = np.stack([np.asarray(Image.fromarray(f).resize(size[::-1], Image.BICUBIC)) for f in base])
    images = AutoProcessor.from_pretrained(SHIPPED).image_processor
    budget = {"shortest_edge": v.min_pixels, "longest_edge": frame_pixel_cap(len(frames), v)}
    sent = images(images=list(frames), size=budget, return_tensors="pt")  # embodied eval's request
    s = TaskSettings("", v.fps, v.max_frames, v.min_pixels, v.max_pixels, v.video_max_pixels)
    ours = budget_frames(frames, s)
    got = images(images=list(ours), return_tensors="pt")  # lmms-eval's request: the server's defaults
    assert got["image_grid_thw"].tolist() == sent["image_grid_thw"].tolist()
    assert torch_equal(got["pixel_values"], sent["pixel_values"])
    assert (ours is frames) == (size == (112, 112))  # untouched when already at the budget's size
    if size[0] * size[1] > budget["longest_edge"]:  # the control: raw frames at the server's defaults differ
        raw = images(images=list(frames), return_tensors="pt")
        assert raw["image_grid_thw"].tolist() != sent["image_grid_thw"].tolist()


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())
