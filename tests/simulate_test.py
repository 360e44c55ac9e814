#!/usr/bin/env python3
"""scripts/simulate.py: the scaling model against closed forms, and its timeline reader."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import simulate as sim  # noqa: E402

GB = 1e9


def net(nodes, per, inter_GBps, intra_GBps=1e6, **kw):
    return sim.Net(nodes, per, inter_GBps * 8, intra_GBps * 8, inter_lat_us=0, intra_lat_us=0, **kw)


class Model(unittest.TestCase):
    def test_one_rank_costs_nothing(self):
        p = sim.Profile(0.1, 0.2, 0.01, 0.0, [(0.2, 100e6)])
        self.assertEqual(sim.step_time(p, net(1, 1, 1), sim.Config())[0], p.compute())
        self.assertEqual(sim.efficiency(p, net(1, 1, 1), sim.Config()), 1.0)

    def test_flat_ring_closed_form(self):
        # One 1 GB bucket ready when backward ends; 2 nodes x 1 at 1 GB/s: 2(P-1)/P x 1 GB / 1 GB/s.
        p = sim.Profile(0.1, 0.2, 0.01, 0.0, [(0.2, 1 * GB)])
        step, exposed = sim.step_time(p, net(2, 1, 1), sim.Config())
        self.assertAlmostEqual(exposed, 1.0)
        self.assertAlmostEqual(step, 0.1 + 0.2 + 1.0 + 0.01)
        # 4 ranks in a node-major ring over 2 nodes: 1.5 GB through each node's egress.
        self.assertAlmostEqual(sim.step_time(p, net(2, 2, 1), sim.Config())[1], 1.5)
        # Latency: 2(P-1) hops.
        n = sim.Net(4, 1, 8.0, inter_lat_us=1000, intra_lat_us=0)
        self.assertAlmostEqual(sim.step_time(sim.Profile(0, 0, 0, 0, [(0, 0)]), n, sim.Config())[1], 6e-3)

    def test_two_level_moves_two_thirds_of_the_flat_ring_bytes_between_nodes(self):
        p = sim.Profile(0.0, 0.0, 0.0, 0.0, [(0.0, 1 * GB)])
        flat = sim.step_time(p, net(2, 2, 1), sim.Config())[1]
        two = sim.step_time(p, net(2, 2, 1), sim.Config(two_level=True))[1]
        self.assertAlmostEqual(flat, 1.5)
        self.assertAlmostEqual(two, 1.0, places=5)  # intra-node stages nearly free here
        # fp16 halves the bytes.
        self.assertAlmostEqual(sim.step_time(p, net(2, 2, 1), sim.Config(fp16=True, two_level=True))[1], 0.5, places=5)

    def test_overlap_hides_early_buckets(self):
        # Ten 0.1 GB buckets ready every 0.1 s of a 1 s backward; each takes 0.1 s on 2 nodes x 1
        # at 1 GB/s: all but the last hide behind backward.
        p = sim.Profile(0.0, 1.0, 0.0, 0.0, [(0.1 * (k + 1), 0.1 * GB) for k in range(10)])
        self.assertAlmostEqual(sim.step_time(p, net(2, 1, 1), sim.Config())[1], 0.1)
        self.assertAlmostEqual(sim.step_time(p, net(2, 1, 1), sim.Config(overlap=False))[1], 1.0)
        # A slower link backs up the pipeline: 0.2 s per bucket, the last ends at 0.1 + 10 x 0.2.
        self.assertAlmostEqual(sim.step_time(p, net(2, 1, 0.5), sim.Config())[1], 2.1 - 1.0)

    def test_streams_lift_a_per_connection_cap(self):
        p = sim.Profile(0.0, 0.0, 0.0, 0.0, [(0.0, 1 * GB)])
        capped = net(2, 1, 4, stream_gbit=8.0)  # 4 GB/s link, 1 GB/s per connection
        self.assertAlmostEqual(sim.step_time(p, capped, sim.Config(streams=1))[1], 1.0)
        self.assertAlmostEqual(sim.step_time(p, capped, sim.Config(streams=2))[1], 0.5)
        self.assertAlmostEqual(sim.step_time(p, capped, sim.Config(streams=8))[1], 0.25)

    def test_stragglers_grow_with_ranks(self):
        p = sim.Profile(0.1, 0.2, 0.0, 0.0, [(0.2, 1.0)])
        e64 = sim.efficiency(p, net(8, 8, 1e6, jitter_cv=0.02), sim.Config())
        e512 = sim.efficiency(p, net(64, 8, 1e6, jitter_cv=0.02), sim.Config())
        self.assertLess(e512, e64)
        self.assertAlmostEqual(1 / e512, 1 + 0.02 * sim.expected_max_normal(512), places=4)
        # E[max] of normals: known values (0.5642 for 2, 1.0294 for 4, 3.0367 for 512).
        self.assertAlmostEqual(sim.expected_max_normal(2), 1 / 3.14159265 ** 0.5, places=3)
        self.assertAlmostEqual(sim.expected_max_normal(4), 1.0294, places=3)
        self.assertAlmostEqual(sim.expected_max_normal(512), 3.0367, delta=0.01)
        # A timeline's own spread is used when the network gives none.
        p.cv = 0.1
        self.assertAlmostEqual(sim.step_time(p, net(2, 2, 1e6), sim.Config())[0],
                               (0.1 + 0.2) * (1 + 0.1 * 1.0294), places=3)


class Timeline(unittest.TestCase):
    def test_profile_is_the_mean_step(self):
        ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}}]
        t = 0.0
        for s, (f, b) in enumerate([(10, 20), (12, 22), (11, 30)]):  # milliseconds
            ev.append({"name": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": t * 1e3, "dur": f * 1e3})
            t += f
            ev.append({"name": "backward", "ph": "X", "pid": 0, "tid": 0, "ts": t * 1e3, "dur": b * 1e3})
            ev.append({"name": "bucket ready", "ph": "i", "s": "g", "pid": 0, "tid": 0, "ts": (t + 5) * 1e3,
                       "args": {"bucket": 0, "bytes": 400}})
            ev.append({"name": "bucket ready", "ph": "i", "s": "g", "pid": 0, "tid": 0, "ts": (t + b) * 1e3,
                       "args": {"bucket": 1, "bytes": 800}})
            t += b
            ev.append({"name": "gradient sync wait", "ph": "X", "pid": 0, "tid": 0, "ts": t * 1e3, "dur": 1e3})
            t += 1
            ev.append({"name": "optimizer", "ph": "X", "pid": 0, "tid": 0, "ts": t * 1e3, "dur": 2e3})
            t += 2 + 3  # 3 ms of data loading before the next step
            ev.append({"name": "allreduce", "ph": "X", "pid": 0, "tid": 1, "ts": t * 1e3, "dur": 1e3})
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(ev, f)
        p = sim.profile_from_timeline(sim.load_events(f.name))
        os.unlink(f.name)
        # Two steps have a successor (the last one's loop overhead is unknown): means of those.
        self.assertAlmostEqual(p.fwd, 0.011)
        self.assertAlmostEqual(p.bwd, 0.021)
        self.assertAlmostEqual(p.cv, 2 / 32)  # compute 30 and 34 ms: 32 +- 2
        self.assertAlmostEqual(p.opt, 0.002)
        self.assertAlmostEqual(p.other, 0.003)
        self.assertEqual([b for _, b in p.buckets], [400, 800])
        self.assertAlmostEqual(p.buckets[0][0], 0.005)
        self.assertAlmostEqual(p.buckets[1][0], 0.021)


if __name__ == "__main__":
    unittest.main()
