"""Two CPU processes (torchrun, gloo) give the same training as one process on the same global batch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from embodied.policy.tiny import TinySpec, build_tiny_policy


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    tiny = build_tiny_policy(root / "tiny", TinySpec(seed=0))
    data = root / "data"
    common = [f"data.root={data}", f"policy.path={tiny}", "data.workers=0", "-q"]
    gen = [sys.executable, "-m", "embodied.cli", "generate", *common]
    subprocess.run(gen + ["data.n_train=8", "data.n_val=2", "data.n_test=2"], check=True, capture_output=True)
    return root, common


def _run(root, common, name: str, nproc: int, command: str, extra: list[str]) -> list[dict]:
    launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"]
    cli = ["-m", "embodied.cli", command, *common, f"run_dir={root / name}", *extra]
    proc = subprocess.run((launch if nproc > 1 else [sys.executable]) + cli, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]


def _metrics(path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _weights(path):
    return load_file(str(path / "model" / "model.safetensors"))


SFT = ["sft.steps=3", "sft.batch_size=4", "sft.log_every=1", "sft.eval_every=0", "sft.checkpoint_every=2"]


@pytest.mark.slow  # 22 s; DDP's SFT step: test_ddp_accumulates_micro_batches_locally..., its loop: grpo[ddp]
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])  # FSDP: grpo, resume
def test_two_processes_equal_one_process_sft(setup, strategy):
    root, common = setup
    if not (root / "sft1").exists():
        _run(root, common, "sft1", 1, "sft", SFT)
    one = _metrics(root / "sft1")
    two = _run(root, common, f"sft2-{strategy}", 2, "sft", [*SFT, f"distributed={strategy}"])
    assert [r["step"] for r in two] == [1, 2, 3]  # only the first process logs
    assert [r["loss/sft"] for r in two] == pytest.approx([r["loss/sft"] for r in one], abs=1e-5)
    assert [r["train/tokens"] for r in two] == [r["train/tokens"] for r in one]
    w1, w2 = _weights(root / "sft1"), _weights(root / f"sft2-{strategy}")
    assert w1.keys() == w2.keys()
    assert all(torch.allclose(w1[k], w2[k], atol=1e-5) for k in w1)
    assert any(
        not torch.equal(w1[k], load_file(str(next(root.glob("tiny/model.safetensors"))))[k]) for k in w1
    )
    # the step-2 checkpoint holds the whole model and optimizer, however the processes held them
    c1 = root / "sft1" / "checkpoints" / "sft" / "step-00000002"
    c2 = root / f"sft2-{strategy}" / "checkpoints" / "sft" / "step-00000002"
    m1, m2 = load_file(str(c1 / "model.safetensors")), load_file(str(c2 / "model.safetensors"))
    tied = {k for k in m1.keys() ^ m2.keys()}  # a tied weight is stored once, under either of its names
    assert all(k.endswith(("lm_head.weight", "embed_tokens.weight")) for k in tied) and len(tied) <= 2
    assert all(torch.allclose(m1[k], m2[k], atol=1e-5) for k in m1.keys() & m2.keys())


@pytest.mark.slow  # 10-12 s; the one all-reduce a step is test_ddp_accumulates_micro_batches_locally...
def test_two_processes_with_micro_batches_equal_one_process_sft(setup):
    """DDP with gradient accumulation: each process splits its 2 rows into 2 micro-batches and all-reduces
    once per step (no_sync on the first part); the update is still the one-process whole-batch one."""
    root, common = setup
    if not (root / "sft1").exists():
        _run(root, common, "sft1", 1, "sft", SFT)
    one = _metrics(root / "sft1")
    two = _run(root, common, "sft2-micro", 2, "sft", [*SFT, "sft.micro_batch_size=1"])
    assert [r["loss/sft"] for r in two] == pytest.approx([r["loss/sft"] for r in one], abs=1e-5)
    w1, w2 = _weights(root / "sft1"), _weights(root / "sft2-micro")
    assert all(torch.allclose(w1[k], w2[k], atol=1e-5) for k in w1)


_COUNT_ALL_REDUCES = """
import pathlib
import torch, torch.distributed as dist
from embodied.train.common import with_last
from embodied.train.distributed import Processes

procs = Processes()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
net = procs.wrap(model)
calls = [0]


def hook(state, bucket):
    calls[0] += 1
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0] / dist.get_world_size())


net.register_comm_hook(None, hook)
x = torch.randn(6, 8) + procs.rank
for every_part in (True, False):
    model.zero_grad()
    calls[0] = 0
    for part, last in with_last(x.split(2)):
        with procs.grad_sync(net, every_part or last):
            procs.backward(net(part).sum())
    if procs.rank == 0:
        print(calls[0], [p.grad.sum().item() for p in model.parameters()])


def gloo_threads():
    tasks = pathlib.Path("/proc/self/task").iterdir()
    return [t for t in tasks if (t / "comm").read_text().strip() == "pt_gloo_runloop"]


# exit only once gloo's worker threads are joined: one still running could free a tensor while the
# interpreter shuts down and abort the process (see Processes.close)
before = gloo_threads()
del net  # the DDP wrapper holds the process group
procs.close()
assert before and not gloo_threads(), (len(before), len(gloo_threads()))
"""


def test_ddp_accumulates_micro_batches_locally_and_all_reduces_once(tmp_path):
    """`Processes.grad_sync`: three micro-batches give the same summed gradient with one all-reduce, not 3."""
    script = tmp_path / "count.py"
    script.write_text(_COUNT_ALL_REDUCES)
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]
    proc = subprocess.run([*launch, str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (every, grads_every), (once, grads_once) = [
        (int(line.split(" ", 1)[0]), json.loads(line.split(" ", 1)[1])) for line in proc.stdout.splitlines()
    ]
    assert (every, once) == (3, 1)
    assert grads_once == pytest.approx(grads_every, abs=1e-6)


@pytest.mark.slow  # 10-23 s; resume itself is tests/test_training_state.py's, FSDP's gathering grpo[fsdp]'s
def test_fsdp_resume_continues_the_run(setup):
    """Two FSDP processes resume from the step-2 checkpoint of a 3-step run and end where it ended."""
    root, common = setup
    name = "sft2-fsdp-resumed"
    done = root / "sft2-fsdp"
    if not done.exists():
        _run(root, common, "sft2-fsdp", 2, "sft", [*SFT, "distributed=fsdp"])
    ckpt = done / "checkpoints" / "sft" / "step-00000002"
    resumed = _run(root, common, name, 2, "sft", [*SFT, "distributed=fsdp", f"resume={ckpt}"])
    assert [r["step"] for r in resumed] == [3]
    assert resumed[0]["loss/sft"] == pytest.approx(_metrics(done)[2]["loss/sft"], abs=1e-6)
    w, w_done = _weights(root / name), _weights(done)
    assert all(torch.allclose(w[k], w_done[k], atol=1e-6) for k in w)


@pytest.fixture(scope="module")
def setup_qwen3(setup):
    """The same data with a tiny Qwen3-VL (deepstack features, timestamped video blocks)."""
    root, common = setup
    path = build_tiny_policy(root / "tiny-qwen3-vl", TinySpec(seed=0), architecture="qwen3-vl")
    return root, [f"policy.path={path}" if c.startswith("policy.path=") else c for c in common]


@pytest.mark.parametrize(
    "strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)]
)  # FSDP (19 s): with the rest of FSDP's tests under -m slow, to keep the default suite within 8 minutes
def test_two_processes_equal_one_process_grpo(setup, strategy):
    """Each process samples its half of the prompts (seeded per prompt) and the update is all-reduced: the
    logged metrics and the weights equal one process's on the same global batch."""
    _grpo_two_equal_one(*setup, strategy, "")


@pytest.mark.slow  # 35 s each on 2 cores; the mechanics are the default suite's Qwen2.5-VL tests above
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_equal_one_process_grpo_qwen3_vl(setup_qwen3, strategy):
    """The same on a Qwen3-VL: DDP and FSDP2 (its decoder layers and vision blocks sharded) train it as one
    process does."""
    _grpo_two_equal_one(*setup_qwen3, strategy, "qwen3-")


def _grpo_two_equal_one(root, common, strategy: str, prefix: str) -> None:
    extra = [
        "grpo.steps=2",
        "grpo.prompts_per_step=4",
        "grpo.group_size=2",
        "grpo.temperatures=[0.8,1.2]",
        "grpo.max_new_tokens=8",
        "grpo.entropy_coef=0.01",
        "grpo.overlong.mode=soft",
        "grpo.overlong.buffer=6",
        "grpo.log_every=1",
        "grpo.checkpoint_every=0",
        # at the default lr 5e-4 DDP's weights differed from one process's by more than 1e-5 after 2 steps
        # (FSDP's did not); the likely cause is Adam scaling last-bit gradient differences (all-reduce order)
        # up to steps of order lr. The equality this test checks is of the mechanics, so it keeps lr 5e-5.
        "grpo.lr=5e-5",
    ]
    if not (root / f"{prefix}grpo1").exists():
        _run(root, common, f"{prefix}grpo1", 1, "grpo", extra)
    one = _metrics(root / f"{prefix}grpo1")
    two = _run(root, common, f"{prefix}grpo2-{strategy}", 2, "grpo", [*extra, f"distributed={strategy}"])
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2]
    for a, b in zip(one, two, strict=True):
        keys = {k for k in a if not k.startswith("time/")}
        assert keys == {k for k in b if not k.startswith("time/")}
        assert {k: b[k] for k in keys} == pytest.approx({k: a[k] for k in keys}, abs=1e-5)
    assert one[1]["loss/kl"] > 0  # the second step's policy has moved away from the reference
    w1, w2 = _weights(root / f"{prefix}grpo1"), _weights(root / f"{prefix}grpo2-{strategy}")
    assert all(torch.allclose(w1[k], w2[k], atol=1e-5) for k in w1)
