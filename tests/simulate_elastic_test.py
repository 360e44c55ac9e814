#!/usr/bin/env python3
"""scripts/simulate_elastic.py: the elastic recovery model against closed forms and the measured case."""
import io
import os
import sys
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import simulate_elastic as el  # noqa: E402

MiB = 2**20


class Elastic(unittest.TestCase):
    def test_state_is_weights_momentum_and_buffers(self):
        self.assertAlmostEqual(el.state_bytes(25.6e6) / MiB, 25.6e6 * 8 * 1.01 / MiB)
        # The measured case: resnet18 with 20 classes sent 86 MiB (app/trainer_elastic.cc's log).
        self.assertLess(abs(el.state_bytes(11.19e6) / MiB - 86), 2)

    def test_heal_closed_forms(self):
        r = el.regroup(64, 25.6e6, 25.0, 1e5, 0.01)
        state = el.state_bytes(25.6e6)
        link = 25e9 / 8
        self.assertAlmostEqual(r["heal_root_s"], 63 * state / link)
        self.assertAlmostEqual(r["heal_tree_s"], state / link + 6 * 50e-6)
        self.assertEqual(r["gloo_connections_per_channel"], 64 * 63 // 2)
        self.assertEqual(r["roster_bytes_total"], 64 * 64 * 40)

    def test_the_store_saturates_where_polling_exceeds_its_rate(self):
        # 2 requests per member per 10 ms poll against 100k requests/s: 500 members.
        self.assertFalse(el.regroup(500, 1e6, 25, 1e5, 0.01)["store_saturated"])
        self.assertTrue(el.regroup(501, 1e6, 25, 1e5, 0.01)["store_saturated"])
        self.assertIn("the store", el.breaks_first(el.regroup(4096, 25.6e6, 25, 1e5, 0.01)))
        self.assertEqual(el.breaks_first(el.regroup(64, 25.6e6, 25, 1e5, 0.01)), "nothing yet")

    def test_table_prints_the_three_sizes(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(el.main(["table"]), 0)
        rows = [line.split()[0] for line in out.getvalue().splitlines()[1:4]]
        self.assertEqual(rows, ["64", "512", "4096"])


if __name__ == "__main__":
    unittest.main()
