"""Confidence intervals for pass rates: Wilson for one proportion, Newcombe for a difference.

A pass rate measured on a few dozen tasks moves by several points from luck alone; these
intervals say how much. Both are the score-interval methods recommended over the Wald interval
for small samples and rates near 0 or 1 (Newcombe, Statistics in Medicine 1998, methods 3
and 10).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from decimal import Decimal
from fractions import Fraction

Z95 = 1.959963984540054
"""The two-sided 95% standard normal quantile."""


def wilson_interval(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of `successes` out of `n` (0..1 when n is 0: nothing known)."""
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    denominator = 1 + z2 / n
    # Exact at the ends (all or none passed), where rounding would leave 0.9999999999999999.
    low = 0.0 if successes == 0 else max(0.0, (centre - spread) / denominator)
    high = 1.0 if successes == n else min(1.0, (centre + spread) / denominator)
    return low, high


def newcombe_interval(
    base_successes: float, base_n: float, other_successes: float, other_n: float, z: float = Z95
) -> tuple[float, float]:
    """Newcombe's hybrid score interval of other rate - base rate (independent samples)."""
    p1 = base_successes / base_n if base_n else 0.0
    p2 = other_successes / other_n if other_n else 0.0
    l1, u1 = wilson_interval(base_successes, base_n, z)
    l2, u2 = wilson_interval(other_successes, other_n, z)
    d = p2 - p1
    lower = d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
    upper = d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    return max(-1.0, lower), min(1.0, upper)


def design_effect(per_task: Sequence[tuple[float, float]]) -> float:
    """How much wider than binomial a pass rate's variance is when samples come in tasks.

    `per_task` is (passed, judged) for each task. The n samples of one task are not independent
    trials: a task the model always solves passes all n. The cluster-robust (sandwich) variance
    over tasks, divided by the binomial variance of the pooled rate, is the design effect
    (Kish): the pooled count over it is the effective number of independent trials. At least
    1 (never narrower than binomial); 1 with one sample per task, or with one task whose
    samples differ (nothing to cluster on).
    At a rate of 0 or 1 neither variance exists, and no sample differs from its task's others:
    the samples are then counted as perfectly correlated (Kish's effect at an intra-task
    correlation of 1, sum(n^2) / sum(n)), so a model that fails every sample of every task is
    no surer to fail at n=8 than at n=1. One task included: eight passes of the README's
    one-task env are one trial, not eight.
    """
    tasks = [(p, n) for p, n in per_task if n > 0]
    total = sum(n for _, n in tasks)
    if total == 0 or all(n == 1 for _, n in tasks):
        return 1.0
    rate = sum(p for p, _ in tasks) / total
    binomial = rate * (1 - rate) / total
    if binomial <= 0:
        return sum(n * n for _, n in tasks) / total
    if len(tasks) < 2:
        return 1.0
    k = len(tasks)
    clustered = k / (k - 1) * sum((p - rate * n) ** 2 for p, n in tasks) / (total * total)
    return max(1.0, clustered / binomial)


def format_interval(interval: tuple[float, float], *, signed: bool = False) -> str:
    """`[41%, 63%]` (or `[+3%, +28%]` for a difference)."""
    spec = "+.0%" if signed else ".0%"
    return f"[{interval[0]:{spec}}, {interval[1]:{spec}}]"


def paired_difference_interval(
    base: Sequence[bool], other: Sequence[bool], z: float = Z95
) -> tuple[float, float, float]:
    """(difference, low, high) of other's rate - base's on the SAME items, paired.

    Newcombe's method 10 for paired proportions (Statistics in Medicine 1998, 17:2635): the
    two Wilson intervals combined with the correlation of the pairs, so items that pass (or
    fail) in both runs count as the agreement they are. Two runs of the same tasks are paired
    data; the independent-samples interval over-states their uncertainty.
    """
    if len(base) != len(other):
        raise ValueError(f"paired outcomes need equal lengths, got {len(base)} and {len(other)}")
    n = len(base)
    if n == 0:
        return 0.0, -1.0, 1.0
    # The 2x2 table of (base passed, other passed) pairs.
    table = Counter(zip(map(bool, base), map(bool, other), strict=True))
    both, neither = table[True, True], table[False, False]
    only_base, only_other = table[True, False], table[False, True]
    p_base, p_other = (both + only_base) / n, (both + only_other) / n
    lb, ub = wilson_interval(both + only_base, n, z)
    lo, uo = wilson_interval(both + only_other, n, z)
    margins = (both + only_base) * (only_other + neither) * (both + only_other)
    margins *= only_base + neither
    # The correlation of the pairs, with Newcombe's correction towards 0 for positive values
    # (ad - bc shrunk by n/2, not below 0), as in the published method.
    cross = both * neither - only_base * only_other
    cross = max(cross - n / 2, 0.0) if cross > 0 else cross
    phi = cross / math.sqrt(margins) if margins else 0.0
    d = p_other - p_base
    below = (p_other - lo) ** 2 - 2 * phi * (p_other - lo) * (ub - p_base) + (ub - p_base) ** 2
    above = (uo - p_other) ** 2 - 2 * phi * (uo - p_other) * (p_base - lb) + (p_base - lb) ** 2
    return d, max(-1.0, d - math.sqrt(max(below, 0.0))), min(1.0, d + math.sqrt(max(above, 0.0)))


def score_sum(scores: Iterable[float]) -> Fraction | float:
    """The exact sum of scores: the same however they were grouped or ordered (a float sum is
    not), so the read model, a rebuild of it, replay and a run's completion agree. A float
    when a score is not finite."""
    values = list(scores)
    if all(math.isfinite(v) for v in values):
        return sum(map(Fraction, values), Fraction(0))
    return math.fsum(values)


def mean_score(total: Fraction | Decimal | float, count: int) -> float:
    """An exact score sum (`score_sum`, or the read model's numeric) over its count, rounded
    once: 384 scores of 0.2 have the mean 0.2. 0.0 with no count."""
    if count <= 0:
        return 0.0
    if isinstance(total, float) or (isinstance(total, Decimal) and not total.is_finite()):
        return float(total) / count
    return float(Fraction(total) / count)
