"""Experiment tracking: TensorBoard event files and W&B offline runs, read back with their own readers.

A real GRPO run of the tiny policy through the CLI with `log.backends=[jsonl,tensorboard,wandb]`; real
rollouts for the samples. No network: a recording proxy on the loopback address catches any HTTP(S) request
from W&B's service process, and a socket guard any connection from this process to a non-local address.
"""

from __future__ import annotations

import glob
import json
import socket
import socketserver
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from embodied.train import tracking
from embodied.train.metrics import MetricsLog, read_metrics
from embodied.train.tracking import LogConfig, Tracking

pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install -e '.[dev]')")
pytest.importorskip("wandb", reason="wandb not installed (pip install -e '.[dev]')")


@pytest.fixture(autouse=True)
def _fresh_tracking(tmp_path, monkeypatch):
    """W&B's own folders under tmp; tracking settings back to jsonl after each test."""
    for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / var.lower()))
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    yield
    tracking.close_all()
    tracking.configure(LogConfig(), tmp_path)


class _Recorder(socketserver.BaseRequestHandler):
    hits: list = []

    def handle(self) -> None:
        _Recorder.hits.append(self.request.recv(200))


@pytest.fixture
def no_network(monkeypatch):
    """Route every proxied HTTP(S) request to a local recorder and refuse non-local connections here.
    Yields the list of recorded requests (must stay empty)."""
    _Recorder.hits = []
    server = socketserver.TCPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, proxy)
    monkeypatch.setenv("NO_PROXY", "")
    connect = socket.socket.connect

    def guarded(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1"):
            raise AssertionError(f"network connection attempted to {address}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield _Recorder.hits
    server.shutdown()
    server.server_close()


def _events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def wandb_records(run_file: str | Path) -> list:
    """The records of a W&B transaction log (`run-<id>.wandb`): a LevelDB-style log of 32 KiB blocks, each
    record a 7-byte header (CRC, length, type: 1 full, 2 first, 3 middle, 4 last) and a protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(run_file).read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0), "not a W&B transaction log"
    records, buf, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or kind == 0:  # block trailer or padding
            pos += left
            continue
        buf = (b"" if kind in (1, 2) else buf) + data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            records.append(rec)
    return records


def _wandb_history(run_dir: Path) -> tuple[dict[int, dict], dict]:
    """`({step: {key: value}}, config)` of the one offline W&B run under `run_dir/wandb`."""
    [run_file] = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, config = {}, {}
    for rec in wandb_records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            history.setdefault(int(row["_step"]), {}).update(row)
        elif kind == "run":
            config |= {i.key: json.loads(i.value_json) for i in rec.run.config.update}
    return history, config


def test_grpo_run_tracks_every_metric_to_tensorboard_and_wandb_offline(tiny_policy, tmp_path, no_network):
    from embodied.cli import main

    data, run = tmp_path / "data", tmp_path / "run"
    small = ["data.n_train=8", "data.n_val=2", "data.n_test=2", "data.workers=0", f"data.root={data}"]
    assert main(["generate", "-q", *small]) == 0
    grpo = ["grpo.steps=3", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=8"]
    grpo += ["grpo.log_every=1", "grpo.checkpoint_every=0"]
    backends = "log.backends=[jsonl,tensorboard,wandb]"
    assert main(["grpo", "-q", *small, *grpo, backends, f"run_dir={run}"]) == 0
    tracking.close_all()

    rows = [r for r in read_metrics(run / "metrics.jsonl") if r["stage"] == "grpo"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    names = {k for r in rows for k, v in r.items() if k not in ("stage", "step") and isinstance(v, float)}
    assert {"loss/policy", "reward/accuracy", "reward/format", "time/step"} <= names
    acc = _events(run / "tensorboard" / "grpo")
    assert names <= set(acc.Tags()["scalars"])
    for name in names:  # same steps, same values (TensorBoard stores float32)
        got = {e.step: e.value for e in acc.Scalars(name)}
        want = {r["step"]: r[name] for r in rows if isinstance(r.get(name), float)}
        assert got.keys() == want.keys() and np.allclose(list(got.values()), list(want.values()), rtol=1e-6)
    assert "config/text_summary" in acc.Tags()["tensors"]

    history, config = _wandb_history(run)
    assert sorted(history) == [1, 2, 3]
    for r in rows:
        assert {k: history[r["step"]][k] for k in names if k in r} == pytest.approx(
            {k: r[k] for k in names if k in r}
        )
    assert config["grpo"]["steps"] == 3 and config["log"]["backends"][-1] == "wandb"
    assert no_network == []  # no HTTP(S) request left this machine's loopback


@pytest.fixture(scope="module")
def rollout(tiny_policy):
    """A real GRPO rollout of the tiny policy: 2 drop clips, 4 answers each, MCQ rewards."""
    from embodied.config import GRPOConfig
    from embodied.data.load import Example
    from embodied.questions import arrow_of_time
    from embodied.rl.rewards import mcq_rewards
    from embodied.rl.rollout import Sampling, sample_groups
    from embodied.video import Clip, VideoConfig
    from embodied.worlds import DropWorld

    world = DropWorld(112, 112)
    examples = []
    for i in range(2):
        record, frames = arrow_of_time.make_example(world, 7 + i, bool(i), arrow_of_time.ClipSpec())
        examples.append(Example({"id": f"s-{i}", "video": "x.mp4", **record}, Clip(frames, 2.0)))
    world.close()
    model, processor = tiny_policy
    cfg = GRPOConfig(group_size=4, max_new_tokens=8)
    return sample_groups(
        model,
        processor,
        examples,
        VideoConfig(),
        mcq_rewards(1.0, 0.5),
        Sampling(cfg.group_size, cfg.max_new_tokens),
        seeds=[1, 2],
    )


def test_rollout_samples_reach_tensorboard_wandb_and_jsonl(rollout, tmp_path, no_network):
    cfg = LogConfig(backends=["jsonl", "tensorboard", "wandb"], samples_every=5, samples=2)
    log = MetricsLog(tmp_path / "metrics.jsonl", "grpo", Tracking(cfg, {"seed": 0}, "samples-test"))
    for step in range(1, 11):  # samples at steps 5 and 10 only
        log.log_rollout(step, rollout)
    log.close()

    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["id"]) for r in rows] == [(5, "s-0"), (5, "s-1"), (10, "s-0"), (10, "s-1")]
    assert (
        rows[0]["answers"] == rollout.texts[:4] and rows[1]["truth"] == rollout.examples[1].record["answer"]
    )
    assert set(rows[0]["rewards"][0]) == set(rollout.terms[0])

    acc = _events(tmp_path / "tensorboard" / "grpo")
    frames = rollout.examples[0].clip.frames
    for tag in ("samples/0", "samples/1"):
        images = acc.Images(tag)
        assert [e.step for e in images] == [5, 10]
        assert (images[0].height, images[0].width) == (112, len(frames) * (112 + 2) - 2)
    assert "samples/text/text_summary" in acc.Tags()["tensors"]

    history, config = _wandb_history(tmp_path)
    assert history[5]["samples/_type"] == "table-file" and history[5]["samples/nrows"] == 8
    assert config["seed"] == 0
    [table] = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / history[10]["samples/path"]))
    content = json.loads(Path(table).read_text())
    assert content["columns"][:5] == ["id", "frames", "truth", "member", "answer"]
    assert [row[4] for row in content["data"][:4]] == rollout.texts[:4]
    assert no_network == []


def test_resumed_log_replaces_tensorboard_events_past_the_checkpoint(tmp_path):
    cfg = Tracking(LogConfig(backends=["tensorboard"]))
    first = MetricsLog(tmp_path / "metrics.jsonl", "sft", cfg)
    for step in range(1, 5):
        first.log(step, {"loss/sft": float(step)})
    first.close()
    again = MetricsLog(tmp_path / "metrics.jsonl", "sft", cfg)
    again.truncate(2)  # resumed from the checkpoint of step 2: steps 3 and 4 are logged again
    for step in (3, 4):
        again.log(step, {"loss/sft": 10.0 * step})
    again.close()
    events = _events(tmp_path / "tensorboard" / "sft").Scalars("loss/sft")
    assert [(e.step, e.value) for e in events] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    assert [r["loss/sft"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.0, 2.0, 30.0, 40.0]


def test_configure_checks_backends_and_keeps_other_ranks_on_jsonl(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown.*mlflow"):
        tracking.configure(LogConfig(backends=["mlflow"]), tmp_path)
    real = tracking.importlib.util.find_spec
    with monkeypatch.context() as m:
        m.setattr(tracking.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
        with pytest.raises(ValueError, match=r"wandb package is not installed.*embodied\[track\]"):
            tracking.configure(LogConfig(backends=["wandb"]), tmp_path)
    monkeypatch.setenv("RANK", "1")
    assert tracking.configure(LogConfig(backends=["tensorboard"]), tmp_path).extra == []
    monkeypatch.setenv("RANK", "0")
    assert tracking.configure(LogConfig(backends=["tensorboard"]), tmp_path / "r").extra == ["tensorboard"]


def test_wandb_is_offline_unless_configured(tmp_path, monkeypatch):
    assert tracking.wandb_mode() == "offline"
    (tmp_path / "no_netrc").write_text("machine api.wandb.ai\n  login user\n  password x\n")
    assert tracking.wandb_mode() == "online"
    (tmp_path / "no_netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert tracking.wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert tracking.wandb_mode() == "disabled"
