"""The numbers of an evaluation, from its prediction rows: accuracy with a 95% interval, chance,
unparseable share, forced choice, pass@k and cons@k; overall, per family and per family x tier; and
the same as a markdown table.

A question may have several views (the `single-frame` baseline shows an even-length clip's two middle
frames separately): every per-question figure is the mean over its views, so a question counts once.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

TIER_ORDER = ("easy", "medium", "hard")
NO_TIER = "unspecified"


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (good at small n and near 0 or 1).

    `successes` may be fractional (questions scored as a mean over views); for scores in [0, 1] with
    mean p the variance is at most p(1 - p), so the interval stays conservative."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(0.0, p * (1 - p)) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


# two-sided 95% quantiles of Student's t by degrees of freedom (1-10); beyond 10, the normal's 1.96 + a margin
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def seed_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean over seeds with its 95% Student-t interval, the spread a rerun with new
    seeds can be expected to land in (with 3 seeds the interval is mean +- 2.48 sample standard deviations).
    One value gives an interval of zero width: no spread was measured."""
    n = len(values)
    if n == 0:
        raise ValueError("seed_interval needs at least one value")
    mean = sum(values) / n
    if n == 1:
        return (mean, mean, mean)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96 + 2.5 / (n - 1)
    half = t * sd / math.sqrt(n)
    return (mean, mean - half, mean + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from `n` samples of which `c` are correct: 1 - C(n-c, k) / C(n, k)
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1): the chance that
    k of the n samples drawn without replacement hold at least one correct answer."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_vote(letters: Sequence[str | None]) -> str | None:
    """The most frequent parsed answer (unparseable samples, None, do not vote; None if none parsed).

    Ties go to the tied answer sampled first. Samples are exchangeable, so this picks each tied answer
    with equal probability; an alphabetical rule would favour `A` and bias cons@k on balanced sets."""
    votes = [x for x in letters if x is not None]
    if not votes:
        return None
    counts = Counter(votes)
    top = max(counts.values())
    return next(x for x in votes if counts[x] == top)


def resolve_k(samples: int, k: Sequence[int]) -> list[int]:
    """The k values reported for `samples` sampled answers per question: `k`, or [1, samples] if empty."""
    if samples < 0:
        raise ValueError(f"eval.samples must be >= 0, got {samples}")
    if not samples:
        return []
    ks = sorted(set(k)) if k else sorted({1, samples})
    bad = [x for x in ks if not 0 < x <= samples]
    if bad:
        raise ValueError(f"eval.k={list(k)} has values outside 1..eval.samples={samples}: {bad}")
    return ks


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def _question(views: list[dict], n_options: int, ks: Sequence[int]) -> dict:
    """Per-question scores, each the mean over the question's views."""
    first = views[0]
    answer = first["answer"]
    q = {
        "family": first["family"],
        "tier": first.get("difficulty") or NO_TIER,
        "chance": 1 / n_options,
        "correct": _mean(v["predicted"] == answer for v in views),
        "unparseable": _mean(v["predicted"] is None for v in views),
    }
    if all(v.get("choice") is not None for v in views):
        q["choice"] = _mean(v["choice"] == answer for v in views)
    if ks and all("sampled" in v for v in views):
        q["unparseable_samples"] = _mean(_mean(x is None for x in v["sampled"]) for v in views)
        for k in ks:
            q[f"pass@{k}"] = _mean(
                pass_at_k(len(v["sampled"]), sum(x == answer for x in v["sampled"]), k) for v in views
            )
            q[f"cons@{k}"] = _mean(majority_vote(v["sampled"][:k]) == answer for v in views)
            q[f"chance_pass@{k}"] = 1 - (1 - 1 / n_options) ** k
    return q


def _stats(qs: list[dict]) -> dict:
    """n, accuracy with its interval, chance and unparseable share of scored questions. With none scored
    (every request of a served evaluation failed) there is no accuracy: None, not a 0 that reads as one."""
    n = len(qs)
    if not n:
        return {"n": 0, "accuracy": None, "ci95": None, "chance": None, "unparseable": None}
    correct = sum(q["correct"] for q in qs)
    out = {
        "n": n,
        "accuracy": correct / n,
        "ci95": list(wilson_interval(correct, n)),
        "chance": _mean(q["chance"] for q in qs),
        "unparseable": _mean(q["unparseable"] for q in qs),
    }
    if qs and all("choice" in q for q in qs):
        out["choice_accuracy"] = _mean(q["choice"] for q in qs)
    sampled = ("pass@", "cons@", "chance_pass@", "unparseable_samples")
    for key in [key for key in qs[0] if key.startswith(sampled)] if qs else []:
        out[key] = _mean(q[key] for q in qs)
    return out


SAMPLED_KEYS = ("pass@", "cons@", "chance_pass@", "unparseable_samples")


def drop_sampled(result: dict) -> dict:
    """Remove every sampled figure (pass@k, cons@k, their chance, unparseable samples) from `result`, overall,
    per family and per family x tier: for a source whose samples are not samples (a server that answers
    greedily), so they are reported unavailable rather than as numbers."""
    blocks = [result, *result.get("per_family", {}).values()]
    blocks += [s for tiers in result.get("per_family_tier", {}).values() for s in tiers.values()]
    for block in blocks:
        for key in [k for k in block if k.startswith(SAMPLED_KEYS)]:
            del block[key]
    return result


def _tier_key(tier: str) -> tuple:
    return (TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER), tier)


def prediction_stats(
    predictions: Sequence[dict], n_options: dict[str, int] | None = None, k: Sequence[int] = ()
) -> dict:
    """Overall figures plus `per_family` and `per_family_tier` (family -> tier) from prediction
    rows. Rows of the same `id` are views of one question. The option count comes from each row's
    `n_options`, else from `n_options[id]`."""
    by_id: dict[str, list[dict]] = defaultdict(list)
    for p in predictions:
        by_id[p["id"]].append(p)
    qs = [_question(views, views[0].get("n_options") or n_options[qid], k) for qid, views in by_id.items()]
    result = _stats(qs)
    families = sorted({q["family"] for q in qs})
    result["per_family"] = {f: _stats([q for q in qs if q["family"] == f]) for f in families}
    result["per_family_tier"] = {
        f: {
            tier: _stats([q for q in qs if q["family"] == f and q["tier"] == tier])
            for tier in sorted({q["tier"] for q in qs if q["family"] == f}, key=_tier_key)
        }
        for f in families
    }
    return result


def by_family(result: dict) -> tuple[dict, dict]:
    """`(per_family, per_family_tier)` of an evaluation result; results written before issue 23 called
    them `per_task` and `per_task_tier`, and read the same."""
    if "per_family" in result or "per_task" not in result:
        return result.get("per_family", {}), result.get("per_family_tier", {})
    return result["per_task"], result.get("per_task_tier", {})


def format_result(result: dict) -> str:
    """One line for humans: accuracy [interval], chance, unparseable, forced choice, pass@k, cons@k."""
    if result["accuracy"] is None:
        failed = len(result.get("failed", []))
        return f"no accuracy: none of the questions was answered (n=0, {failed} failed)"
    lo, hi = result["ci95"]
    line = (
        f"accuracy {result['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] on n={result['n']} "
        f"(chance {result['chance']:.2f}, unparseable {result['unparseable']:.1%}"
    )
    if "choice_accuracy" in result:
        line += f", forced-choice {result['choice_accuracy']:.3f}"
    for key in result:
        if key.startswith(("pass@", "cons@")):
            line += f", {key} {result[key]:.3f}"
    sampling = result.get("settings", {}).get("sampling", "")
    return line + ")" + (f"; pass@k and cons@k {sampling}" if sampling else "")


def markdown_table(result: dict, title: str = "") -> str:
    """A markdown table: one row overall, one per family, one per family x tier."""
    sampled = [key for key in result if key.startswith(("pass@", "cons@"))]
    choice = "choice_accuracy" in result
    head = ["family", "tier", "n", "accuracy [95% CI]", "chance", "unparseable"]
    head += ["forced choice"] * choice + sampled

    def line(family: str, tier: str, s: dict) -> str:
        if s["accuracy"] is None:
            return "| " + " | ".join([family, tier, "0", "none answered"] + [""] * (len(head) - 4)) + " |"
        lo, hi = s["ci95"]
        cells = [family, tier, str(s["n"]), f"{s['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]"]
        cells += [f"{s['chance']:.3f}", f"{s['unparseable']:.1%}"]
        cells += [f"{s.get('choice_accuracy', float('nan')):.3f}"] * choice
        cells += [f"{s.get(key, float('nan')):.3f}" for key in sampled]
        return "| " + " | ".join(cells) + " |"

    rows = [line("**all**", "all", result)]
    per_family, per_family_tier = by_family(result)
    for family, s in per_family.items():
        rows.append(line(family, "all", s))
        rows += [line(family, tier, st) for tier, st in per_family_tier[family].items()]
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows]
    notes = [f"pass@k and cons@k {s}" for s in [result.get("settings", {}).get("sampling")] if s]
    notes += list(result.get("notes", []))
    notes = ["", *notes] if notes else []
    return "\n".join(([f"### {title}", ""] if title else []) + table + notes) + "\n"
