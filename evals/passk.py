"""Pure estimators: unbiased pass@k and the mean with its standard error."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """The unbiased estimate of pass@k from n attempts of which c passed: 1 - C(n-c, k) / C(n, k).
    None when k > n (not estimable from n attempts)."""
    if not 0 <= c <= n:
        raise ValueError(f"c={c} must be between 0 and n={n}")
    if k < 1 or k > n:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_and_stderr(values: list[float]) -> tuple[float | None, float | None]:
    """(mean, standard error of the mean: sample standard deviation / sqrt(n)); None where undefined
    (no values; one value has no standard error)."""
    n = len(values)
    if n == 0:
        return None, None
    mean = sum(values) / n
    if n == 1:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)
