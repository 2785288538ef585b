"""Experiment tracking beyond `metrics.jsonl`: TensorBoard and Weights & Biases, with rollout samples.

`metrics.jsonl` is always written (`embodied.train.metrics.MetricsLog`). `log.backends` adds `tensorboard`
(event files under `<run_dir>/tensorboard/<stage>/`) and `wandb` (one W&B run per stage, grouped by the run
folder's name, files under `<run_dir>/wandb/`). Both get the same metric names and steps as the JSONL
rows, and the run's config. W&B runs offline unless the user has configured it (`WANDB_API_KEY`, a
`~/.netrc` entry for W&B, or `WANDB_MODE`): it never asks for a login and, offline, never opens a network
connection (system stats, machine info, git and code capture are off: the stats monitor would query a
cloud metadata address). Runs under several processes track from the first process only.

`configure(cfg.log, run_dir, config)` (called by each command's setup) sets what every `MetricsLog` opened
afterwards tracks; the backends open lazily on the first row, so a process that never logs opens nothing.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path

import numpy as np

BACKENDS = ("jsonl", "tensorboard", "wandb")
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
STRIP_FRAMES = 8
"""At most this many frames (evenly spaced) in a rollout sample's strip."""


@dataclass
class LogConfig:
    """Where metrics and rollout samples go (`log:` section)."""

    backends: list[str] = field(default_factory=lambda: ["jsonl"])
    """Any of jsonl (`metrics.jsonl`, always written), tensorboard, wandb. The last two need
    `pip install 'embodied[track]'`. W&B runs offline unless you configured it (API key or `wandb login`)."""
    wandb_project: str = "embodied"
    """W&B project; runs of one run folder share a group named after it, one W&B run per stage."""
    samples_every: int = 10
    """GRPO: every this many steps, log rollout samples (frame strip, answers, reward terms, correct
    answer) to `samples.jsonl` and the tracking backends (0 = never)."""
    samples: int = 4
    """Prompts per rollout sample; each comes with all of its group's answers."""


@dataclass
class Tracking:
    """What `configure` set: the config section, the run's whole config and the run's name."""

    cfg: LogConfig = field(default_factory=LogConfig)
    config: dict = field(default_factory=dict)
    run_name: str = "run"

    @property
    def extra(self) -> list[str]:
        """The backends besides jsonl."""
        return [b for b in self.cfg.backends if b != "jsonl"]


_CURRENT = Tracking()
_OPEN: set[Tracker] = set()  # held until closed: a W&B run must be finished to keep its last rows


def process_rank() -> int:
    """This process's rank under `torchrun` / `accelerate launch` (0 when launched alone)."""
    return int(os.environ.get("RANK", "0") or 0)


def check_backends(backends: Sequence[str]) -> None:
    """Fail before any work on an unknown backend or a backend whose package is not installed."""
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ValueError(f"log.backends: unknown {unknown}; choose from {list(BACKENDS)}")
    missing = [b for b in backends if b in PACKAGES and importlib.util.find_spec(PACKAGES[b]) is None]
    if missing:
        raise ValueError(
            f"log.backends={list(backends)}: the {' and '.join(missing)} package is not installed; "
            "install it with: pip install 'embodied[track]'"
        )


def configure(cfg: LogConfig, run_dir: str | Path, config=None) -> Tracking:
    """Make every `MetricsLog` opened from now on track to `cfg.backends`, with `config` (a dict or a
    dataclass such as the run's `Config`) attached.

    Checks the backends first (unknown name, package missing: `ValueError`). Processes other than the
    first keep only jsonl. Returns the settings now in force."""
    global _CURRENT
    check_backends(cfg.backends)
    if process_rank() > 0:
        cfg = replace(cfg, backends=["jsonl"])
    config = asdict(config) if is_dataclass(config) else dict(config or {})
    _CURRENT = Tracking(cfg, config, Path(run_dir).resolve().name or "run")
    return _CURRENT


def current() -> Tracking:
    """The settings `configure` set last (default: jsonl only)."""
    return _CURRENT


def wandb_mode() -> str:
    """`WANDB_MODE` if the user set it; "online" when W&B is configured (API key, or a `~/.netrc` entry
    for its host); else "offline", which never contacts a server or asks for a login."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1].split("/")[0]
    netrc = Path(os.environ.get("NETRC", "~/.netrc")).expanduser()
    try:
        configured = f"machine {host}" in netrc.read_text()
    except OSError:
        configured = False
    return "online" if configured else "offline"


def numeric(metrics: dict) -> dict[str, float]:
    """The values of `metrics` that are numbers (tensors' items included), as floats."""
    out = {}
    for k, v in metrics.items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def frame_strip(frames: np.ndarray, max_frames: int = STRIP_FRAMES, gap: int = 2) -> np.ndarray:
    """`(H, n * W + (n - 1) * gap, 3)` uint8: up to `max_frames` evenly spaced frames side by side."""
    frames = np.asarray(frames)
    idx = np.unique(np.linspace(0, len(frames) - 1, min(len(frames), max_frames)).round().astype(int))
    h, w = frames.shape[1:3]
    out = np.full((h, len(idx) * (w + gap) - gap, 3), 255, np.uint8)
    for j, i in enumerate(idx):
        out[:, j * (w + gap) : j * (w + gap) + w] = frames[i]
    return out


def rollout_samples(rollout, n: int) -> list[dict]:
    """Samples of the first `n` prompts of a GRPO `Rollout`: the frames the policy saw, every answer of the
    group with its reward terms, and the correct answer. Multi-turn rollouts (`rollout.owner`): each member's
    answer lists its turns, its rewards are per turn (`turn<k>/...`) and the trajectory's, and
    `turn_frames` holds the outcome clip each later turn saw."""
    G = rollout.group_size
    if rollout.owner is not None:
        return _turn_samples(rollout, n)
    out = []
    for p, ex in enumerate(rollout.examples[:n]):
        rows = range(p * G, (p + 1) * G)
        out.append(
            {
                "id": ex.record.get("id", str(p)),
                "question": ex.record.get("question", ""),
                "truth": ex.record.get("answer", ""),
                "frames": ex.clip.frames,
                "answers": [rollout.texts[r] for r in rows],
                "rewards": [numeric(rollout.terms[r]) for r in rows],
            }
        )
    return out


def _turn_samples(rollout, n: int) -> list[dict]:
    G, out = rollout.group_size, []
    rows_of: dict[int, list[int]] = {}
    for r, t in enumerate(rollout.owner.tolist()):
        rows_of.setdefault(t, []).append(r)  # rows are in turn order
    rewards = rollout.rewards.flatten().tolist()
    for p, ex in enumerate(rollout.examples[:n]):
        answers, terms, frames = [], [], []
        for g in range(G):
            t = p * G + g
            rows = rows_of.get(t, [])
            answers.append(" -> ".join(f"turn {k + 1}: {rollout.texts[r]}" for k, r in enumerate(rows)))
            per = {"trajectory/reward": rewards[t]}
            for k, r in enumerate(rows):
                per |= {f"turn{k + 1}/{key}": v for key, v in numeric(rollout.terms[r]).items()}
            terms.append(per)
            clips = rollout.clips[t][1:] if rollout.clips else []
            frames += [(f"member{g}_turn{k + 2}", c.frames) for k, c in enumerate(clips)]
        out.append(
            {
                "id": ex.record.get("id", str(p)),
                "question": ex.record.get("question", ""),
                "truth": ex.record.get("answer", ""),
                "frames": ex.clip.frames,
                "turn_frames": frames,
                "answers": answers,
                "rewards": terms,
            }
        )
    return out


def _markdown(sample: dict) -> str:
    """A sample as a Markdown table (TensorBoard's text plugin renders it)."""
    head = f"**{sample['id']}**: correct answer **{sample['truth']}**\n\n"
    head += "| # | answer | rewards |\n|---|---|---|\n"
    rows = []
    for i, (text, terms) in enumerate(zip(sample["answers"], sample["rewards"])):
        cell = " ".join(text.split()).replace("|", "\\|") or "(empty)"
        rows.append(f"| {i} | `{cell}` | {', '.join(f'{k} {v:.2f}' for k, v in terms.items())} |")
    return head + "\n".join(rows)


class Tracker:
    """The TensorBoard writer and W&B run of one `MetricsLog` (one stage of one run folder).

    Both open on first use. `purge_step` (set by a resumed run) makes TensorBoard drop the old events from
    that step on, as the JSONL rows past the checkpoint are dropped."""

    def __init__(self, log_dir: str | Path, stage: str, tracking: Tracking, purge_step: int | None = None):
        self.log_dir, self.stage, self.tracking = Path(log_dir), stage, tracking
        self.purge_step = purge_step
        self._tb = None
        self._wandb = None
        _OPEN.add(self)

    @property
    def tb(self):
        if self._tb is None and "tensorboard" in self.tracking.cfg.backends:
            import yaml
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(
                str(self.log_dir / "tensorboard" / self.stage), purge_step=self.purge_step
            )
            if self.tracking.config:
                text = yaml.safe_dump(self.tracking.config, sort_keys=False)
                self._tb.add_text("config", "```\n" + text + "```", 0)
        return self._tb

    @property
    def wandb(self):
        if self._wandb is None and "wandb" in self.tracking.cfg.backends:
            self._wandb = _wandb_run(self.log_dir, self.stage, self.tracking)
        return self._wandb

    def scalars(self, step: int, metrics: dict) -> None:
        """Every number of `metrics` under its own name at `step`."""
        values = numeric(metrics)
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def samples(self, step: int, samples: Sequence[dict]) -> None:
        """Rollout samples: TensorBoard images (`samples/<i>`) and text (`samples/text`); a W&B table
        (`samples`), one row per answer."""
        if self.tb is not None:
            for i, s in enumerate(samples):
                self.tb.add_image(f"samples/{i}", frame_strip(s["frames"]), step, dataformats="HWC")
                for name, frames in s.get("turn_frames", []):  # multi-turn: what each later turn saw
                    self.tb.add_image(f"samples/{i}/{name}", frame_strip(frames), step, dataformats="HWC")
            self.tb.add_text("samples/text", "\n\n".join(_markdown(s) for s in samples), step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({"samples": _wandb_table(samples)}, step=step)

    def close(self) -> None:
        """Flush and close the writer; finish the W&B run (its summary is written then)."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        _OPEN.discard(self)


def _wandb_run(log_dir: Path, stage: str, tracking: Tracking):
    """A new W&B run for `stage`: offline unless configured, nothing collected that needs the network."""
    mode = wandb_mode()
    if mode == "offline":
        os.environ["WANDB_MODE"] = "offline"
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # no crash reports either
    import wandb

    atexit.unregister(close_all)  # run before wandb's own exit hook, registered at its import
    atexit.register(close_all)
    quiet = {
        "x_disable_stats": True,
        "x_disable_machine_info": True,
        "x_disable_meta": True,
        "x_disable_update_check": True,
        "disable_git": True,
        "disable_code": True,
        "save_code": False,
        "console": "off",
        "silent": True,
    }
    known = getattr(wandb.Settings, "model_fields", quiet)  # settings differ between W&B versions
    settings = wandb.Settings(**{k: v for k, v in quiet.items() if k in known})
    log_dir.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=tracking.cfg.wandb_project,
        group=tracking.run_name,
        job_type=stage,
        name=f"{tracking.run_name}-{stage}",
        config=tracking.config,
        dir=str(log_dir),
        mode=mode,
        settings=settings,
        reinit="create_new",
    )


def _wandb_table(samples: Sequence[dict]):
    import wandb

    terms = sorted({k for s in samples for r in s["rewards"] for k in r})
    table = wandb.Table(columns=["id", "frames", "truth", "member", "answer", *terms])
    for s in samples:
        strip = wandb.Image(frame_strip(s["frames"]))
        for g, (text, r) in enumerate(zip(s["answers"], s["rewards"])):
            table.add_data(s["id"], strip, s["truth"], g, text, *(r.get(k) for k in terms))
    return table


def close_all() -> None:
    """Close every tracker still open (W&B runs write their summary when finished)."""
    for tracker in list(_OPEN):
        tracker.close()


atexit.register(close_all)
