"""Statistics for the bench reports (scripts/bench/report.py)."""

import math


def median_interval(xs, level=0.95):
    """The distribution-free interval for a median (sign test): the k-th
    smallest and k-th largest of the n values, k the largest with
    P(Binomial(n, 1/2) < k) <= (1 - level) / 2. None when n is too small
    for any interval at this level (n < 6 at 95 %)."""
    n, tail = len(xs), (1 - level) / 2
    k, below = 0, 0.0  # below = P(Binomial(n, 1/2) < k)
    while k < n:
        below_next = below + math.comb(n, k) / 2**n
        if below_next > tail:
            break
        k, below = k + 1, below_next
    if k == 0:
        return None
    s = sorted(xs)
    return s[k - 1], s[n - k]
