"""A dataset from its config section: pick the source, hand it to the engine, or reuse what is on disk."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from embodied.data.engine import Source, write_dataset
from embodied.data.families import FamilySource, QuickstartSource
from embodied.data.from_videos import VideoSource
from embodied.data.load import manifest_matches
from embodied.data.schema import DataConfig
from embodied.questions import family, is_family


def source_of(cfg: DataConfig) -> Source:
    """User videos (`data.from_videos`), simulated families (`data.families`, or a benchmark), or else the
    quickstart's arrow of time."""
    if cfg.from_videos:
        return VideoSource(cfg)
    if cfg.families or cfg.benchmark:
        return FamilySource(cfg)
    return QuickstartSource(cfg)


def generate_dataset(cfg: DataConfig, progress: bool = True) -> dict:
    """Write the splits of `cfg` (or its benchmark) under `cfg.root`; returns the manifest."""
    return write_dataset(source_of(cfg), progress)


def dataset_matches(cfg: DataConfig) -> bool:
    """True if `cfg.root` holds a dataset generated with the same settings (worker count aside) by the
    question families as they are now: a family whose `VERSION` differs from the manifest's
    `generator_version` makes other questions for the same seeds, so its old data is not reused."""
    if not manifest_matches(cfg.root, asdict(cfg), {"workers"}):
        return False
    made = json.loads((Path(cfg.root) / "manifest.json").read_text()).get("generator_version", {})
    return all(version == family(name).VERSION for name, version in made.items() if is_family(name))


def ensure_dataset(cfg: DataConfig, progress: bool = True) -> None:
    """Generate `cfg`'s dataset unless `cfg.root` already holds it."""
    if dataset_matches(cfg):
        print(f"reusing the dataset in {cfg.root} (same config)")
    else:
        generate_dataset(cfg, progress=progress)
