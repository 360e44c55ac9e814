#!/usr/bin/env python3
"""scripts/convergence/report.py: its statistics against closed forms and brute force, and its
tables from metrics files written here."""
import itertools
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "scripts", "convergence", "report.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import report  # noqa: E402


def brute_p(a, b):
    """Two-sided rank-sum p-value by enumerating every split of the pooled values."""
    pooled = a + b
    order = sorted(pooled)
    def midrank(v):
        lo = order.index(v)
        hi = lo + order.count(v)
        return (lo + 1 + hi) / 2
    ranks = [midrank(v) for v in pooled]
    mean = len(a) * sum(ranks) / len(pooled)
    obs = abs(sum(ranks[: len(a)]) - mean)
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    far = sum(abs(sum(ranks[i] for i in s) - mean) >= obs - 1e-9 for s in splits)
    return far / len(splits)


class Statistics(unittest.TestCase):
    def test_rank_sum_closed_forms(self):
        # Separated samples of 3 and 3: only the two extreme splits of C(6,3) = 20 are as far.
        self.assertAlmostEqual(report.rank_sum_p([1, 2, 3], [4, 5, 6]), 2 / 20)
        self.assertAlmostEqual(report.rank_sum_p([4, 5, 6], [1, 2, 3]), 2 / 20)
        # 5 against 5, separated: 2 / C(10,5).
        self.assertAlmostEqual(report.rank_sum_p([10, 11, 12, 13, 14], [1, 2, 3, 4, 5]), 2 / 252)
        self.assertEqual(report.rank_sum_p([1.0], [2.0]), 1.0)
        self.assertEqual(report.rank_sum_p([7, 7], [7, 7]), 1.0)  # all tied
        self.assertEqual(report.rank_sum_p([], [1, 2]), 1.0)

    def test_rank_sum_equals_brute_force_with_ties(self):
        rng = random.Random(5)
        for _ in range(40):
            m, n = rng.randint(1, 6), rng.randint(1, 6)
            a = [rng.choice([10, 20, 30, 40, 50, 60]) for _ in range(m)]
            b = [rng.choice([10, 20, 30, 40, 50, 60]) for _ in range(n)]
            self.assertAlmostEqual(report.rank_sum_p(a, b), brute_p(a, b), msg=f"{a} {b}")

    def test_time_to_target_and_its_median(self):
        run = [(1, 10.0, 40.0), (2, 20.0, 69.9), (3, 30.0, 70.0), (4, 40.0, 90.0)]
        self.assertEqual(report.time_to_target(run, 70), 30.0)
        self.assertIsNone(report.time_to_target(run, 95))
        self.assertEqual(report.median_time([10, None, 20]), 20)
        self.assertIsNone(report.median_time([None, None, 5]))
        self.assertIsNone(report.median_time([10, None]))  # the middle of two is infinitely late
        self.assertEqual(report.median_time([10, 20]), 15)
        self.assertIsNone(report.median_time([]))
        self.assertEqual(report.seconds_per_epoch(run), 10.0)
        self.assertIsNone(report.seconds_per_epoch([]))


class Tables(unittest.TestCase):
    def test_a_side_whose_median_seed_misses_the_target_is_not_reached(self):
        with tempfile.TemporaryDirectory() as out:
            # aiacc: metrics-file lines (step lines are skipped); torch: torch_ref.py lines.
            for seed, tops in enumerate([[50, 72], [60, 75], [55, 71]]):
                with open(os.path.join(out, f"aiacc.{seed}.jsonl"), "w") as f:
                    f.write(json.dumps({"type": "step", "step": 1, "loss": 2.0}) + "\n")
                    for e, t in enumerate(tops):
                        f.write(json.dumps({"type": "eval", "epoch": e + 1, "seconds": 5.0 * (e + 1), "top1": t}) + "\n")
            for seed, tops in enumerate([[71, 80], [20, 30], [40, 60]]):
                with open(os.path.join(out, f"torch.{seed}.jsonl"), "w") as f:
                    for e, t in enumerate(tops):
                        f.write(json.dumps({"epoch": e + 1, "seconds": 10.0 * (e + 1), "top1": t}) + "\n")
            text = subprocess.run([sys.executable, SCRIPT, "--out", out, "--seeds", "0 1 2", "--sides",
                                   "aiacc torch", "--target", "70"], check=True, capture_output=True,
                                  text=True).stdout
        lines = text.splitlines()
        # Ranks of aiacc's seeds among the 6: {3, 4, 5}, sum 12 against a mean of 10.5; 14 of the 20
        # 3-subsets of 1..6 sum to <= 9 or >= 12: p = 0.70, at both epochs.
        self.assertIn("55.0 [50.0 60.0 55.0] p=0.70", next(l for l in lines if l.strip().startswith("1 ")))
        self.assertIn("72.0 [72.0 75.0 71.0] p=0.70", next(l for l in lines if l.strip().startswith("2 ")))
        self.assertRegex(text, r"aiacc\s+5.00\s+0.50x torch's")
        self.assertRegex(text, r"aiacc\s+10.0\s+\(seeds: 10 10 10; 3 of 3 reached it\)")
        self.assertRegex(text, r"torch\s+not reached\s+\(seeds: 10 - -; 1 of 3 reached it\)")
        self.assertIn("aiacc / torch: torch's median seed never reached 70%", text)


if __name__ == "__main__":
    unittest.main()
