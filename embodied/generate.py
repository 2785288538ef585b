"""The data engine: question families x scenes x tiers from a spec, simulated in parallel workers.

`generate(cfg)` plans every record up front (split, family, tier, seed, answer), so a dataset is a pure
function of its spec: the same spec and seed give the same records and frames, whatever the number of
workers. Answers are balanced per split, family and tier; each (split, family, tier) group draws its
seeds from its own `SeedSequence` stream, and a benchmark draws from a stream no training split uses.
`data.from_videos` hands over to `embodied.from_videos`, which cuts real footage instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from embodied.datasets import FORMAT_VERSION, SPLITS, DataConfig
from embodied.tasks import TIERS, Ambiguous, FamilySpec, balanced_answers, family
from embodied.video import write_video

GENERATOR = "embodied.generate"
BENCHMARK_STREAM = "benchmark"


@dataclass(frozen=True)
class Job:
    split: str
    index: int
    family: int
    seed: int
    answer: int
    tier: str


def stream_code(name: str) -> int:
    """Integer key of a named seed stream: train/val/test are 0/1/2 (as `split_seeds`), others hashed."""
    if name in SPLITS:
        return SPLITS.index(name)
    return 100 + int(hashlib.md5(name.encode()).hexdigest()[:6], 16)


def group_seeds(base: int, stream: str, fam: int, tier: str, n: int) -> list[int]:
    """Seeds of one (stream, family, tier) group; `fam + 1` keeps every group off the quickstart's streams."""
    seq = np.random.SeedSequence([base, stream_code(stream), fam + 1, TIERS.index(tier)])
    return [int(s) for s in seq.generate_state(n, dtype=np.uint64) % (2**63)]


def apportion(total: int, weights: list[float]) -> list[int]:
    """Split `total` in proportion to `weights` (largest remainder): the parts sum to `total`."""
    w = np.asarray(weights, dtype=float)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"family weights must be >= 0 and not all 0, got {weights}")
    exact = total * w / w.sum()
    parts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - parts), kind="stable")[: total - parts.sum()]:
        parts[i] += 1
    return parts.tolist()


def check_families(families: list[FamilySpec]) -> None:
    for f in families:
        family(f.task)  # raises with the known names
        bad = [t for t in f.tiers if t not in TIERS]
        if bad or not f.tiers:
            raise ValueError(f"family {f.task}: tiers must be a non-empty subset of {TIERS}, got {f.tiers}")


def split_sizes(cfg: DataConfig) -> dict[str, int]:
    if cfg.benchmark:
        return {"test": cfg.n_test}
    return {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test}


def plan(cfg: DataConfig) -> list[Job]:
    """Every record to make, in file order: per split, families interleaved in a seeded random order."""
    fams = cfg.families or [FamilySpec()]
    check_families(fams)
    jobs: list[Job] = []
    for split, n in split_sizes(cfg).items():
        stream = BENCHMARK_STREAM if cfg.benchmark else split
        code = stream_code(stream)
        group: list[tuple[int, int, int, str]] = []  # family, seed, answer, tier
        for fi, (f, nf) in enumerate(zip(fams, apportion(n, [f.weight for f in fams]))):
            for tier, nt in zip(f.tiers, apportion(nf, [1.0] * len(f.tiers))):
                rng = np.random.default_rng([cfg.seed, code, fi + 1, TIERS.index(tier), 7919])
                answers = balanced_answers(nt, family(f.task).num_options(tier, f.variant), rng)
                seeds = group_seeds(cfg.seed, stream, fi, tier, nt)
                group += [(fi, s, int(a), tier) for s, a in zip(seeds, answers)]
        order = np.random.default_rng([cfg.seed, code, 31337]).permutation(len(group))
        jobs += [Job(split, i, *group[j]) for i, j in enumerate(order)]
    seeds = [j.seed for j in jobs]
    if len(set(seeds)) != len(seeds):
        raise RuntimeError("seed collision between records; choose another data.seed")
    return jobs


# --- workers ------------------------------------------------------------------------------------------

_STATE: dict = {}  # per worker process: spec and one world (GL context) per scene, reused for every clip


def _init_worker(cfg: DataConfig) -> None:
    _STATE.clear()
    _STATE.update(cfg=cfg, worlds={})


def _world(scene: str):
    worlds = _STATE["worlds"]
    if scene not in worlds:
        cfg = _STATE["cfg"]
        worlds[scene] = make_world(scene, cfg.width, cfg.height)
    return worlds[scene]


def make_world(scene: str, width: int, height: int):
    """A world from the `embodied.worlds` registry (`drop` also works without it)."""
    import embodied.worlds as worlds

    if hasattr(worlds, "make_world"):
        return worlds.make_world(scene, width=width, height=height)
    if scene != "drop":
        raise ValueError(f"unknown scene {scene!r}; this version of embodied.worlds only has 'drop'")
    return worlds.DropWorld(width=width, height=height)


def store(root: Path, rid: str, split: str, record: dict, frames: np.ndarray, fps: float) -> tuple[dict, str]:
    """Write the clip (and the PNG of a still) under `root`; returns the full record and its content digest.

    The digest hashes the raw frames and the record, not the encoded file, so it does not depend on the
    video encoder's build."""
    rel = f"videos/{split}/{rid}.mp4"
    write_video(root / rel, frames, fps)
    full = {"id": rid, "task": record["task"], "video": rel}
    if record["meta"].get("still"):
        from PIL import Image

        img = f"images/{split}/{rid}.png"
        (root / img).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(frames[0]).save(root / img)
        full["images"] = [img]
    full |= {k: v for k, v in record.items() if k != "task"}
    h = hashlib.sha256(json.dumps(full, sort_keys=True).encode())
    h.update(np.ascontiguousarray(frames).tobytes())
    return full, h.hexdigest()


def _make(job: Job) -> tuple[dict | None, str]:
    """Simulate and store one record; `(None, reason)` when the family could not make it unambiguous."""
    cfg: DataConfig = _STATE["cfg"]
    fam = (cfg.families or [FamilySpec()])[job.family]
    module = family(fam.task)
    rng = np.random.default_rng(job.seed)
    try:
        record, frames = module.make(_world(fam.scene), rng, job.answer, job.tier, fam, cfg.clip)
    except Ambiguous as e:
        return None, f"{job.split}-{job.index:06d} ({fam.task}/{fam.scene}, seed {job.seed}): {e}"
    record["meta"] = {"seed": job.seed, "difficulty": job.tier, **record["meta"]}
    return store(Path(cfg.root), f"{job.split}-{job.index:06d}", job.split, record, frames, cfg.clip.fps)


@contextlib.contextmanager
def light_spawn():
    """Start spawned workers without re-importing the parent's `__main__`.

    `spawn` re-runs the main module in every child (as `__mp_main__`). Under `embodied generate` that is
    `embodied.cli`, whose imports pull in torch and transformers: ~700 MB and seconds of start-up per
    worker that only simulates and renders. The workers' functions live in importable modules, so hiding
    the main module's origin while the pool starts is safe."""
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__spec__", "__file__") if main is not None and hasattr(main, k)}
    try:
        for k in saved:
            setattr(main, k, None) if k == "__spec__" else delattr(main, k)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def run_jobs(cfg: DataConfig, jobs: list[Job], progress: bool) -> Iterator[tuple[dict | None, str]]:
    """Results of `jobs`, in order, as they are made; `cfg.workers` spawned processes (0 = this one)."""
    bar = tqdm(total=len(jobs), desc="generate", unit="clip", disable=not progress)
    if cfg.workers > 0:
        ctx = mp.get_context("spawn")  # fresh processes: GL contexts do not survive fork
        with light_spawn():
            pool = ctx.Pool(cfg.workers, initializer=_init_worker, initargs=(cfg,))
        with pool:
            for res in pool.imap(_make, jobs, chunksize=8):
                bar.update()
                yield res
    else:
        _init_worker(cfg)
        try:
            for job in jobs:
                res = _make(job)
                bar.update()
                yield res
        finally:
            for world in _STATE["worlds"].values():
                world.close()
            _STATE.clear()
    bar.close()


# --- the dataset ------------------------------------------------------------------------------------------


def generate(cfg: DataConfig, progress: bool = True) -> dict:
    """Write the splits of `cfg` (or its benchmark) under `cfg.root`; returns the manifest."""
    if cfg.from_videos:
        from embodied.from_videos import generate_from_videos

        return generate_from_videos(cfg, progress)
    root = Path(cfg.root)
    root.mkdir(parents=True, exist_ok=True)
    jobs = plan(cfg)
    t0 = time.perf_counter()
    splits = SplitWriter(root, list(split_sizes(cfg)))
    skipped = []
    with splits:  # records go to disk as they are made: memory stays flat however many clips
        for record, digest in run_jobs(cfg, jobs, progress):
            if record is None:
                skipped.append(digest)  # for a skipped job, the reason
            else:
                splits.add(record, digest)
    wall = time.perf_counter() - t0
    fams = cfg.families or [FamilySpec()]
    seed_streams = {
        split: [cfg.seed, stream_code(BENCHMARK_STREAM if cfg.benchmark else split)]
        for split in split_sizes(cfg)
    }
    extra = {
        "families": [asdict(f) for f in fams],
        "seed_streams": seed_streams,
        "skipped": {"count": len(skipped), "items": skipped},
        "wall_s": round(wall, 2),
        "clips_per_s": round(len(jobs) / wall, 2) if wall > 0 else None,
    }
    return finish(cfg, splits, extra)


class SplitWriter:
    """Streams records into `<root>/<split>.jsonl` (via `.tmp` files, renamed when all went well) and keeps
    only what the manifest needs: per split a running hash of the record digests and the tallies.

    A record belongs to the split its id starts with (`train-000012`).
    """

    def __init__(self, root: Path, splits: list[str]):
        self.root, self.splits = Path(root), splits
        self.hash = {s: hashlib.sha256() for s in splits}
        self.counts: dict = {s: {} for s in splits}
        self.answers: dict = {s: {} for s in splits}
        self.tasks: set[str] = set()
        self.made = 0
        self.files: dict = {}

    def __enter__(self) -> SplitWriter:
        self.files = {s: (self.root / f"{s}.jsonl.tmp").open("w") for s in self.splits}
        return self

    def add(self, record: dict, digest: str) -> None:
        split = next((s for s in self.splits if record["id"].startswith(f"{s}-")), None)
        if split is None:
            raise ValueError(f"record id {record['id']!r} names none of the splits {self.splits}")
        self.files[split].write(json.dumps(record) + "\n")
        self.hash[split].update(digest.encode())
        count(record, self.counts[split], self.answers[split])
        self.tasks.add(record["task"])
        self.made += 1

    def __exit__(self, exc_type, *exc) -> None:
        for f in self.files.values():
            f.close()
        for s in self.splits:
            tmp = self.root / f"{s}.jsonl.tmp"
            if exc_type is None:
                tmp.replace(self.root / f"{s}.jsonl")
            else:  # a failed run leaves the previous split files as they were
                tmp.unlink(missing_ok=True)


def finish(cfg: DataConfig, splits: SplitWriter, extra: dict) -> dict:
    """Write the manifest (counts, answers, versions, content hash), the dataset card and contact sheets
    for the split files `splits` wrote."""
    root = Path(cfg.root)
    content = hashlib.sha256()
    counts: dict = {}
    answers: dict = {}
    hashes: dict = {}
    for split in splits.splits:
        hashes[split] = splits.hash[split].hexdigest()
        content.update(hashes[split].encode())
        counts[split], answers[split] = sort_tally(splits.counts[split], splits.answers[split])
    tasks = sorted(splits.tasks)
    manifest = {
        "generator": GENERATOR,
        "generator_version": {"embodied": _package_version(), **{t: family(t).VERSION for t in tasks}},
        "format_version": FORMAT_VERSION,
        "benchmark": cfg.benchmark,
        "tasks": tasks,
        "seed": cfg.seed,
        "counts": counts,
        "answers": answers,
        "content_hash": {"sha256": content.hexdigest(), "splits": hashes},
        **extra,
        "config": asdict(cfg),
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    write_card(root, [s for s in splits.splits if sum(sum(t.values()) for t in counts[s].values())])
    if cfg.sheets and splits.made:
        from embodied.contact_sheet import write_sheets

        manifest["sheets"] = [str(p) for p in write_sheets(root, splits.splits)]
    return manifest


def family_label(record: dict) -> str:
    """`task`, or `task/variant` for families whose variants ask different questions."""
    variant = record["meta"].get("variant")
    return f"{record['task']}/{variant}" if variant else record["task"]


def count(r: dict, counts: dict, answers: dict) -> None:
    """Add record `r` to the counts per family (`task` or `task/variant`) and tier, and to the answer-letter
    counts per family and tier."""
    name, tier = family_label(r), r["meta"].get("difficulty", "easy")
    counts.setdefault(name, {}).setdefault(tier, 0)
    counts[name][tier] += 1
    letters = answers.setdefault(name, {}).setdefault(tier, {})
    letters[r["answer"]] = letters.get(r["answer"], 0) + 1


def sort_tally(counts: dict, answers: dict) -> tuple[dict, dict]:
    """The tallies with families, tiers and letters in sorted order (stable manifests)."""
    answers = {name: dict(per_tier) for name, per_tier in answers.items()}
    for per_tier in answers.values():
        for tier, letters in per_tier.items():
            per_tier[tier] = dict(sorted(letters.items()))
    return dict(sorted(counts.items())), dict(sorted(answers.items()))


def write_card(root: Path, splits: list[str]) -> None:
    """A dataset card whose YAML header lets `datasets.load_dataset(str(root))` find the split files."""
    files = "\n".join(f"    - split: {s}\n      path: {s}.jsonl" for s in splits)
    (root / "README.md").write_text(
        f"---\nconfigs:\n- config_name: default\n  data_files:\n{files}\n---\n\n"
        "Generated by `embodied generate`; see `manifest.json` for how, and the project's data/FORMAT.md.\n"
    )


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("embodied")
    except PackageNotFoundError:
        return "unknown"
