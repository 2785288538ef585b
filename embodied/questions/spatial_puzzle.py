"""Spatial puzzle: a frame cut into a grid of patches and shuffled; which arrangement is the real frame?

Two variants, both one still image shown as a two-frame still clip (one temporal patch of Qwen's vision
tower, as the processor does with images) and also stored as PNG for image-only models:

- `arrangement` (default): the shuffled patches are numbered where they now stand; the four options are
  sequences of those numbers, and the right one lists, row by row, the patch that belongs at each place
  of the original frame. Distractors are other orders, never "1, 2, 3, 4" (nothing shuffled).
- `patch`: one shuffled patch is outlined in red; the options are places in the original grid.

Easy tier: a 2x2 grid. Hard tier: 3x3. A frame whose patches are too alike to be told apart (bare floor,
sky) could make two options equally right, so distractors must visibly differ from the truth; a frame
that leaves too few of them is rejected (`Ambiguous`) and simulated scenes draw another moment. Footage
must do more: a near-uniform patch of real wall or floor carries nothing to place it by, so a frame with
any patch flatter than `FOOTAGE_MIN_PATCH_STD` is not used (the window's other frames are tried first).
"""

from __future__ import annotations

import numpy as np

from embodied.questions import (
    LETTERS,
    Ambiguous,
    answer_text,
    order_options,
    order_text,
    piece_difference,
    places_trace,
    reset_world,
    restoring_order,
    scene_meta,
    visible_shuffle,
)

NAME = "spatial_puzzle"
VERSION = 2
"""2: footage frames with a near-uniform patch are not used (`FOOTAGE_MIN_PATCH_STD`)."""
RANK = 1
VARIANTS = ("arrangement", "patch")
GRID = {"easy": 2, "hard": 3}
NUM_OPTIONS = 4
DISTINCT_TOL = 4.0
"""An option counts as visibly different from the truth when the patch it changes most differs by more than
this mean absolute difference (0-255): two patches of plain sky or floor are interchangeable."""
FOOTAGE_MIN_PATCH_STD = 14.0
"""Footage: every patch's grey levels must have at least this standard deviation (0-255). Measured on the
shared real clips at 112 px (docs/data.md): plain wall and seat patches 8.8-12.7, patches with a person,
an edge or an object 13.2 and up."""
MAX_TRIES = 20
MAX_TIME = 1.5
"""Latest moment (s) shown on worlds without `info["motion"]`: drop objects are still in view and moving."""
ROWS = {2: ("top", "bottom"), 3: ("top", "middle", "bottom")}
COLS = {2: ("left", "right"), 3: ("left", "centre", "right")}
ARRANGEMENT_Q = (
    "This image was cut into a {g}x{g} grid of patches, which were shuffled and numbered 1 to {n} where they "
    "now stand. Which sequence gives the numbers of the patches of the original image, row by row from the "
    "top left?"
)
PATCH_Q = (
    "This image was cut into a {g}x{g} grid of patches, which were then shuffled. Where was the patch "
    "outlined in red in the original image?"
)


def num_options(tier: str, variant: str = "") -> int:
    return NUM_OPTIONS


def options_are_orders(record: dict) -> bool:
    """Arrangement options are orders of the numbered patches (patch options are places)."""
    return ((record.get("meta") or {}).get("variant") or VARIANTS[0]) == "arrangement"


def place_name(i: int, g: int) -> str:
    r, c = divmod(i, g)
    if g == 3 and (r, c) == (1, 1):
        return "centre"
    return f"{ROWS[g][r]} {COLS[g][c]}"


def cut(image: np.ndarray, g: int) -> np.ndarray:
    """Patches `(g*g, p, p, 3)` of the central `g*p` square of `image (H, W, 3)`, row by row."""
    p = min(image.shape[:2]) // g
    p -= (g * p) % 2  # H.264 needs even sides
    y0, x0 = (image.shape[0] - g * p) // 2, (image.shape[1] - g * p) // 2
    sq = image[y0 : y0 + g * p, x0 : x0 + g * p]
    return sq.reshape(g, p, g, p, 3).swapaxes(1, 2).reshape(g * g, p, p, 3)


def assemble(patches: np.ndarray, order) -> np.ndarray:
    """The image whose place j holds `patches[order[j]]`; `(g*p, g*p, 3)`."""
    g = int(round(len(patches) ** 0.5))
    p = patches.shape[1]
    grid = patches[list(order)].reshape(g, g, p, p, 3).swapaxes(1, 2)
    return np.ascontiguousarray(grid.reshape(g * p, g * p, 3))


def _label(image: np.ndarray, g: int) -> None:
    """Write each place's number (1-based, row by row) into its top-left corner, white on black outline."""
    import cv2

    p = image.shape[0] // g
    scale = p / 110
    for j in range(g * g):
        r, c = divmod(j, g)
        org = (c * p + 3, r * p + int(24 * scale) + 3)
        for colour, width in (((0, 0, 0), 3), ((255, 255, 255), 1)):
            cv2.putText(image, str(j + 1), org, cv2.FONT_HERSHEY_SIMPLEX, scale, colour, width, cv2.LINE_AA)


def _outline(image: np.ndarray, g: int, j: int) -> None:
    import cv2

    p = image.shape[0] // g
    r, c = divmod(j, g)
    cv2.rectangle(image, (c * p + 1, r * p + 1), (c * p + p - 2, r * p + p - 2), (255, 0, 0), 2)


def puzzle(
    image: np.ndarray, rng: np.random.Generator, answer: int, tier: str, variant: str
) -> tuple[dict, np.ndarray]:
    """Question fields (no `family`/`meta` scene fields) and the puzzle image for one frame `(H, W, 3)`."""
    variant = variant or VARIANTS[0]
    if variant not in VARIANTS:
        raise ValueError(f"spatial_puzzle variant must be one of {VARIANTS}, got {variant!r}")
    g = GRID[tier]
    patches = cut(image, g)
    shown = visible_shuffle(patches, rng, DISTINCT_TOL)
    out = assemble(patches, shown)
    meta = {"variant": variant, "grid": g, "shown_order": shown}
    if variant == "arrangement":
        _label(out, g)

        def looks_different(order: list[int]) -> bool:  # what this option would rebuild vs the truth
            return piece_difference(patches[shown][[x - 1 for x in order]], patches) > DISTINCT_TOL

        options = order_options(restoring_order(shown), answer, NUM_OPTIONS, rng, accept=looks_different)
        question = ARRANGEMENT_Q.format(g=g, n=g * g)
        texts = [order_text(o) for o in options]
    else:
        places, j = _patch_places(patches, shown, answer, g, rng)
        _outline(out, g, j)
        meta["outlined"] = j + 1
        question = PATCH_Q.format(g=g)
        texts = [place_name(i, g) for i in places]
    fields = {"question": question, "options": texts, "answer": LETTERS[answer]}
    return fields | {"meta": meta}, out


def _patch_places(
    patches: np.ndarray, shown: list[int], answer: int, g: int, rng: np.random.Generator
) -> tuple[list[int], int]:
    """Option places (truth at `answer`) and the shown place of the outlined patch. A distractor place must
    hold, in the original, a patch that looks different from the outlined one."""
    for j in [int(x) for x in rng.permutation(g * g)]:
        truth = shown[j]
        ok = [
            i
            for i in range(g * g)
            if i != truth and piece_difference(patches[[i]], patches[[truth]]) > DISTINCT_TOL
        ]
        if g == 2 and truth == answer and len(ok) == 3:  # 2x2: all four places, in reading order
            return list(range(4)), j
        if g > 2 and len(ok) >= NUM_OPTIONS - 1:
            places = [int(x) for x in rng.permutation(ok)[: NUM_OPTIONS - 1]]
            places.insert(answer, truth)
            return places, j
    raise Ambiguous("no patch looks different from enough others", "few_distractors")


def make(world, rng: np.random.Generator, answer: int, tier: str, fam, clip) -> tuple[dict, np.ndarray]:
    """A puzzle from one rendered moment of a simulated scene; returns `(record, still clip (2, H, W, 3))`."""
    for attempt in range(MAX_TRIES):
        info = reset_world(world, rng, tier)
        t = _moment(info, rng)
        frame = world.record([t])[0]
        try:
            fields, image = puzzle(frame, rng, answer, tier, fam.variant)
        except Ambiguous:
            continue
        meta = fields.pop("meta") | {"time_s": round(t, 4), "attempts": attempt + 1, "fps": clip.fps}
        meta |= {"still": True, **scene_meta(fam.scene, info)}
        return {"family": NAME, **fields, "meta": meta}, np.stack([image, image])
    raise Ambiguous(f"no frame of {fam.scene!r} with distinct patches in {MAX_TRIES} scenes")


def _moment(info: dict, rng: np.random.Generator) -> float:
    if "motion" in info:
        t0, t1 = (float(x) for x in info["motion"])
        return float(rng.uniform(t0, t1))
    return float(rng.uniform(0.0, MAX_TIME))


def flattest_patch(image: np.ndarray, g: int) -> float:
    """The smallest standard deviation of grey levels among the `g x g` patches of `image (H, W, 3)`."""
    grey = cut(image, g).astype(np.float32).mean(axis=-1)
    return float(grey.reshape(g * g, -1).std(axis=1).min())


def from_frames(
    frames: np.ndarray, fps: float, rng: np.random.Generator, answer: int, tier: str, fam
) -> tuple[dict, np.ndarray]:
    """A puzzle from a frame of a window of real footage, trying its frames in random order: the first whose
    patches all carry texture (`FOOTAGE_MIN_PATCH_STD`) and give a unique answer. Raises `Ambiguous` (reason
    `uniform_patches` when no frame qualifies) otherwise."""
    refused: Ambiguous | None = None
    for k in (int(x) for x in rng.permutation(len(frames))):
        flat = flattest_patch(frames[k], GRID[tier])
        if flat < FOOTAGE_MIN_PATCH_STD:
            continue
        try:
            fields, image = puzzle(frames[k], rng, answer, tier, fam.variant)
        except Ambiguous as e:
            refused = e
            continue
        meta = fields.pop("meta") | {"frame_index": k, "fps": fps, "still": True}
        meta["flattest_patch_std"] = round(flat, 1)
        return {"family": NAME, **fields, "meta": meta}, np.stack([image, image])
    raise refused or Ambiguous(
        f"every frame has a near-uniform patch (grey std < {FOOTAGE_MIN_PATCH_STD}): nothing to place it by",
        "uniform_patches",
    )


def verify(record: dict, original: np.ndarray) -> bool:
    """The answer is the only option that puts the shuffled patches of `original (H, W, 3)` back."""
    meta = record["meta"]
    g, shown = meta["grid"], meta["shown_order"]
    right = LETTERS.index(record["answer"])
    if meta["variant"] == "patch":
        truth = place_name(shown[meta["outlined"] - 1], g)
        return [o == truth for o in record["options"]] == [i == right for i in range(len(record["options"]))]
    patches = cut(original, g)
    puzzle_patches = patches[shown]  # place j of the shown image holds original patch shown[j]

    def restores(text: str) -> bool:
        order = [int(x) - 1 for x in text.split(",")]
        return np.array_equal(assemble(puzzle_patches, order), assemble(patches, range(g * g)))

    return [restores(o) for o in record["options"]] == [i == right for i in range(len(record["options"]))]


def reasoning_for(record: dict) -> str:
    """SFT rationale: what the answer means, stated from the label."""
    text = answer_text(record)
    if record["meta"]["variant"] == "patch":
        return f"Edges and objects continue across patches only if the outlined patch sits at the {text}."
    return f"Placing the patches as {text} makes edges, floor and objects continue across the seams."


def trace_for(record: dict) -> str:
    """SFT trace (`sft.rationale=trace`). arrangement: each shown patch's place in the original, row by row,
    then the order (`tasks.places_trace`); patch: where the outlined patch is shown, then where it was."""
    meta = record["meta"]
    if meta["variant"] == "patch":
        shown_at = place_name(meta["outlined"] - 1, meta["grid"])
        return f"outlined at {shown_at} -> {answer_text(record)}"
    return places_trace(record)
