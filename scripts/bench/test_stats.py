"""Checks scripts/bench/stats.py (run by `cargo xtask ci`):
python3 -m unittest discover -s scripts/bench -p 'test_*.py'"""

import unittest

from stats import median_interval


class MedianInterval(unittest.TestCase):
    def test_order_statistics_match_the_sign_test_tables(self):
        # (n, k): the 95 % interval runs from the k-th smallest to the k-th
        # largest value (published sign-test tables).
        for n, k in ((6, 1), (8, 1), (9, 2), (10, 2), (12, 3), (15, 4), (16, 4), (20, 6), (30, 10)):
            xs = list(range(1, n + 1))
            self.assertEqual(median_interval(xs), (k, n + 1 - k), f"n={n}")

    def test_too_few_values_give_no_interval(self):
        for n in range(6):
            self.assertIsNone(median_interval(list(range(n))), f"n={n}")

    def test_unsorted_input_and_level(self):
        xs = [5, -3, 9, 0, 2, 7, -1, 4, 8, 1]
        self.assertEqual(median_interval(xs), (-1, 8))
        # A lower level narrows it: 80 % takes the 3rd values of 10.
        self.assertEqual(median_interval(xs, level=0.80), (0, 7))


if __name__ == "__main__":
    unittest.main()
