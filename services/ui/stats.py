"""Small statistics the pages show."""

from __future__ import annotations

import math


def wilson_interval(passed: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval for a pass rate (95% for z=1.96); (0, 1) with no trials."""
    if total <= 0:
        return 0.0, 1.0
    if not 0 <= passed <= total:
        raise ValueError(f"passed={passed} must lie between 0 and total={total}")
    p = passed / total
    z2 = z * z
    centre = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = z * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total)) / (1 + z2 / total)
    return max(0.0, centre - half), min(1.0, centre + half)
