"""Simulated sources of the engine: question families x scenes x tiers, and the quickstart's arrow of time.

A plan lists every record up front (split, family, tier, seed, answer), so a dataset is a pure function of
its spec: the same spec and seed give the same records and frames, whatever the number of workers. Answers
are balanced per split, family and tier; each (split, family, tier) group draws its seeds from its own
`SeedSequence` stream, and a benchmark draws from a stream no training split uses.

The quickstart (`data.families` empty, no benchmark) is a plan of its own, made by the default family (the
default `FamilySpec`: arrow of time's drop clips of `data.clip`, half of each split reversed) through its
`quickstart_answers` and `quickstart_example` hooks, seeds from the split's stream (`split_seeds`), in the
record format it always had.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from embodied.data.engine import Made, Source, store
from embodied.data.schema import SPLITS, DataConfig, split_seeds, stream_code
from embodied.questions import (
    TIERS,
    Ambiguous,
    FamilySpec,
    balanced_answers,
    family,
    hook,
)

BENCHMARK_STREAM = "benchmark"


@dataclass(frozen=True)
class FamilyJob:
    split: str
    index: int
    family: int
    seed: int
    answer: int
    tier: str


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
        family(f.family)  # raises with the known names
        bad = [t for t in f.tiers if t not in TIERS]
        if bad or not f.tiers:
            raise ValueError(f"family {f.family}: tiers must be a non-empty subset of {TIERS}, got {f.tiers}")


def split_sizes(cfg: DataConfig) -> dict[str, int]:
    if cfg.benchmark:
        return {"test": cfg.n_test}
    return {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test}


def plan(cfg: DataConfig) -> list[FamilyJob]:
    """Every record to make, in file order: per split, families interleaved in a seeded random order."""
    fams = cfg.families or [FamilySpec()]
    check_families(fams)
    jobs: list[FamilyJob] = []
    for split, n in split_sizes(cfg).items():
        stream = BENCHMARK_STREAM if cfg.benchmark else split
        code = stream_code(stream)
        group: list[tuple[int, int, int, str]] = []  # family, seed, answer, tier
        for fi, (f, nf) in enumerate(zip(fams, apportion(n, [f.weight for f in fams]))):
            for tier, nt in zip(f.tiers, apportion(nf, [1.0] * len(f.tiers))):
                rng = np.random.default_rng([cfg.seed, code, fi + 1, TIERS.index(tier), 7919])
                answers = balanced_answers(nt, family(f.family).num_options(tier, f.variant), rng)
                seeds = group_seeds(cfg.seed, stream, fi, tier, nt)
                group += [(fi, s, int(a), tier) for s, a in zip(seeds, answers)]
        order = np.random.default_rng([cfg.seed, code, 31337]).permutation(len(group))
        jobs += [FamilyJob(split, i, *group[j]) for i, j in enumerate(order)]
    check_unique([j.seed for j in jobs])
    return jobs


def check_unique(seeds: list[int]) -> None:
    if len(set(seeds)) != len(seeds):
        raise RuntimeError("seed collision between records; choose another data.seed")


class FamilySource(Source):
    """`data.families` (or a benchmark): every family simulated in its scene, records balanced per tier."""

    name = "families"

    def __init__(self, cfg: DataConfig) -> None:
        super().__init__(cfg, cfg.root, list(split_sizes(cfg)), cfg.workers, cfg.sheets)
        self.families = cfg.families or [FamilySpec()]

    def jobs(self) -> list[FamilyJob]:
        return plan(self.cfg)

    def make(self, job: FamilyJob) -> list[Made]:
        """Simulate and store one record; `(None, reason)` when the family could not make it unambiguous."""
        cfg, fam = self.cfg, self.families[job.family]
        rid = f"{job.split}-{job.index:06d}"
        rng = np.random.default_rng(job.seed)
        world = self.world(fam.scene, cfg.width, cfg.height)
        try:
            record, frames = family(fam.family).make(world, rng, job.answer, job.tier, fam, cfg.clip)
        except Ambiguous as e:
            return [(None, f"{rid} ({fam.family}/{fam.scene}, seed {job.seed}): {e}")]
        record["meta"] = {"seed": job.seed, "difficulty": job.tier, **record["meta"]}
        return [store(self.root, rid, job.split, record, frames, cfg.clip.fps)]

    def extra(self) -> dict:
        stream = {s: BENCHMARK_STREAM if self.cfg.benchmark else s for s in self.splits}
        return {
            "families": [asdict(f) for f in self.families],
            "seed_streams": {s: [self.cfg.seed, stream_code(stream[s])] for s in self.splits},
        }


class QuickstartSource(Source):
    """The quickstart: the default family's (`FamilySpec()`) own plan in its default scene, the same number
    of records per answer in each split (arrow of time: half of the drop clips of `data.clip` reversed)."""

    name = "quickstart"
    chunksize = 16

    def __init__(self, cfg: DataConfig) -> None:
        super().__init__(cfg, cfg.root, list(SPLITS), cfg.workers, cfg.sheets)
        self.spec = FamilySpec()

    def jobs(self) -> list[tuple[str, int, int, int]]:
        """`(split, index, seed, answer)` per record."""
        cfg, jobs = self.cfg, []
        answers_for = hook(family(self.spec.family), "quickstart_answers")
        for split, n in split_sizes(cfg).items():
            seeds = split_seeds(cfg.seed, split, n)
            answers = answers_for(n, np.random.default_rng([cfg.seed, 7919, SPLITS.index(split)]))
            jobs += [(split, i, seeds[i], int(answers[i])) for i in range(n)]
        check_unique([j[2] for j in jobs])
        return jobs

    def make(self, job: tuple[str, int, int, int]) -> list[Made]:
        split, index, seed, answer = job
        world = self.world(self.spec.scene, self.cfg.width, self.cfg.height)
        example = hook(family(self.spec.family), "quickstart_example")
        record, frames = example(world, seed, answer, self.cfg.clip)
        return [store(self.root, f"{split}-{index:06d}", split, record, frames, self.cfg.clip.fps)]

    def extra(self) -> dict:
        return {"seed_streams": {s: [self.cfg.seed, SPLITS.index(s)] for s in self.splits}}
