"""Does the vision tower carry the answer? A linear probe on a policy's visual tokens, per question family.

When a policy stays at chance on a family, two reasons look alike in its accuracy: its visual tokens do not
hold what decides the answer (perception), or they do and the language model does not learn to read it
(learning). A linear classifier trained on the frozen tokens separates them: if it reads the answer well
above the majority class, the information is there.

The probe's target is the answer's option text (forward / reversed, a segment order, a patch position), so
that the class means the same thing in every question whatever letter it got. Features are every merged
visual token of the clip, flattened in Qwen's order (temporal patch, row, column), standardised with the
training set's mean and deviation. The classifier is multinomial logistic regression fitted by full-batch
AdamW; its weight decay is chosen on a fifth of the training examples held out, then refitted on all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from embodied.data.load import Example
from embodied.eval.stats import wilson_interval
from embodied.questions import family, hook, is_family

WEIGHT_DECAYS = (1e-3, 1e-2, 1e-1, 1.0)


def group_of(example: Example) -> str:
    """`family/scene` (plus `/variant` where a family has several): the unit a probe is fitted on."""
    meta = example.record.get("meta", {})
    name = example.record["family"]
    parts = [name, meta.get("scene", "")]
    default = hook(family(name), "VARIANTS")[0] if is_family(name) else ""
    if meta.get("variant") not in (None, "", default):
        parts.append(meta["variant"])
    return "/".join(p for p in parts if p)


def answer_text(example: Example) -> str:
    rec = example.record
    return rec["options"][ord(rec["answer"]) - ord("A")]


@torch.no_grad()
def visual_features(model, processor, examples: Sequence[Example], video) -> list[torch.Tensor]:
    """Each example's merged visual tokens, flattened: a list of 1-D tensors (tiers of one family may differ
    in frame count, so in length)."""
    from embodied.policy.model import encode_prompts

    vis = model.model.visual
    rows = []
    for e in examples:
        batch = encode_prompts(processor, [e.record], [e.clip], video)
        if "pixel_values_videos" in batch:
            pixels, grid = batch["pixel_values_videos"], batch["video_grid_thw"]
        else:
            pixels, grid = batch["pixel_values"], batch["image_grid_thw"]
        rows.append(vis(pixels.to(vis.dtype), grid_thw=grid).pooler_output.float().flatten())
    return rows


def _padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Rows zero-padded to `width` (a shorter clip's missing tokens read as 0)."""
    return torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in rows])


def _fit(x: torch.Tensor, y: torch.Tensor, n_classes: int, weight_decay: float, steps: int = 300):
    torch.manual_seed(0)
    lin = torch.nn.Linear(x.shape[1], n_classes)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2, weight_decay=weight_decay)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(lin(x), y).backward()
        opt.step()
    return lin


def pooled(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Flattened features of `dim`-wide tokens, `(n, tokens * dim)` (no padding), pooled over the tokens:
    mean and max per coordinate, `(n, 2 dim)`. Which token holds what is lost; what the tokens hold is
    kept."""
    x = x.reshape(len(x), -1, dim)
    return torch.cat([x.mean(1), x.amax(1)], 1)


def padded_features(model, processor, a: Sequence[Example], b: Sequence[Example], video):
    """`visual_features` of two sets of examples as two matrices zero-padded to one width."""
    x_a, x_b = visual_features(model, processor, a, video), visual_features(model, processor, b, video)
    width = max(r.numel() for r in x_a + x_b)
    return _padded(x_a, width), _padded(x_b, width)


def linear_probe(
    x_train,
    y_train: list[str],
    x_test,
    y_test: list[str],
    predictions: bool = False,
    per_feature: bool = True,
) -> dict:
    """Accuracy of a linear classifier of the answer text on held-out features, against the majority class
    of the training answers (its share of the test answers); with `predictions`, also its predicted class
    per test row (`predictions`), e.g. to act on them. Features are centred and divided by their own
    deviation each (`per_feature`), or all by one deviation, which keeps their relative scales as a
    language model receives them."""
    classes = sorted(set(y_train))
    index = {c: i for i, c in enumerate(classes)}
    mean = x_train.mean(0)
    std = x_train.std(0) + 1e-6 if per_feature else (x_train - mean).std() + 1e-6
    xtr, xte = (x_train - mean) / std, (x_test - mean) / std
    ytr = torch.tensor([index[c] for c in y_train])
    n_fit = len(ytr) - max(1, len(ytr) // 5)
    scores = {}
    for wd in WEIGHT_DECAYS:
        lin = _fit(xtr[:n_fit], ytr[:n_fit], len(classes), wd)
        scores[wd] = (lin(xtr[n_fit:]).argmax(1) == ytr[n_fit:]).float().mean().item()
    wd = max(WEIGHT_DECAYS, key=lambda w: (scores[w], w))  # ties: the stronger decay
    pred = _fit(xtr, ytr, len(classes), wd)(xte).argmax(1).tolist()
    correct = sum(classes[p] == t for p, t in zip(pred, y_test))
    majority = max(classes, key=lambda c: (y_train.count(c), c))
    base = sum(t == majority for t in y_test)
    return {
        "n_train": len(y_train),
        "n_test": len(y_test),
        "classes": len(classes),
        "accuracy": round(correct / len(y_test), 4),
        "ci95": [round(v, 4) for v in wilson_interval(correct, len(y_test))],
        "majority": round(base / len(y_test), 4),
        "weight_decay": wd,
    } | ({"predictions": [classes[p] for p in pred]} if predictions else {})


def probe_families(model, processor, train: Sequence[Example], test: Sequence[Example], video) -> dict:
    """`linear_probe` per family group present in both `train` and `test` (`group_of`), on zero-padded
    features."""
    by_group: dict[str, list[list[Example]]] = defaultdict(lambda: [[], []])
    for side, examples in enumerate((train, test)):
        for e in examples:
            by_group[group_of(e)][side].append(e)
    out = {}
    for group, (tr, te) in sorted(by_group.items()):
        if len(tr) < 10 or not te:
            continue
        x_tr, x_te = padded_features(model, processor, tr, te, video)
        out[group] = linear_probe(x_tr, [answer_text(e) for e in tr], x_te, [answer_text(e) for e in te])
    return out
