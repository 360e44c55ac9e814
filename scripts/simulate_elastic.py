#!/usr/bin/env python3
"""aiacc elastic recovery at scale: what a lost rank costs at 64, 512 and 4096 ranks, by arithmetic
on the protocol aiacc runs (comm/membership.h, app/trainer_elastic.cc), checked against the small
cases measured on one box.

  simulate_elastic.py table [--params 25.6e6] [--link-gbit 25] [--store-rps 100000] [--poll-ms 10]
                            [--last-call 1] [--ranks 64,512,4096]

Per regroup, for N surviving ranks (one lost, so nobody waits the last call):
  detection  shared memory: the 20 ms poll of a waiter's slow path; Gloo: at once (sockets close);
             a stopped rank: the heartbeat timeout (3 s). Independent of N: a rank's neighbours see
             it, and their abort reaches everyone else in one hop.
  store      each member: a check, a ticket, its record, a survivor count, a lost report (5
             requests), then a poll (a check and a counter, 2 requests) every poll interval until
             the generation closes; the closer reads N records and writes 3 keys; each member
             reads the roster once (about 40 bytes per member: N x 40 bytes each, N^2 x 40 in
             all). TCPStore serves requests one by one on one thread: polling N ranks every
             --poll-ms is N x 2 / poll requests per second, which saturates --store-rps.
  transports Gloo connects a full mesh per channel: N(N-1)/2 connections per channel. Shared
             memory: one segment per node. NCCL: one unique id through the store, O(1) requests.
  state      weights + momentum (8 bytes per fp32 parameter) + buffers (~1%), sent from the new
             rank 0 when a rank lacks it (a joiner, a rank behind): a root that sends to each rank
             moves (N-1) x state through its link; a pipelined tree or ring moves state once per
             link: state / link + log2(N) hops. Survivors that all hold rank 0's state (the
             usual loss of a rank) compare a CRC and receive only the position, a few KiB; the
             heal columns are then the joiner's case.
"""
import argparse
import math
import sys

ROSTER_BYTES_PER_MEMBER = 40
REQUESTS_PER_MEMBER = 5  # check(closed), add(ticket), set(record), add(survivors), add(lost)
POLL_REQUESTS = 2  # check(closed), add(arrivals, 0)


def state_bytes(params):
    """Training state sent to each rank: fp32 weights and momentum, BatchNorm buffers (~1%)."""
    return params * 4 * 2 * 1.01


def regroup(n, params, link_gbit, store_rps, poll_s, arrival_spread_s=0.05, hop_latency_s=50e-6):
    """One regroup of n ranks (every rank of the last generation accounted for): a dict of costs."""
    link = link_gbit * 1e9 / 8  # bytes per second
    polls = max(1.0, arrival_spread_s / poll_s)  # each member polls until the last one arrives
    requests = n * (REQUESTS_PER_MEMBER + POLL_REQUESTS * polls + 1) + n + 3
    poll_load = n * POLL_REQUESTS / poll_s  # requests per second while they wait
    store_s = max(requests / store_rps, arrival_spread_s)
    roster_total = n * n * ROSTER_BYTES_PER_MEMBER
    state = state_bytes(params)
    return {
        "ranks": n,
        "store_requests": int(requests),
        "poll_load_rps": poll_load,
        "store_saturated": poll_load > store_rps,
        "store_s": store_s + roster_total / link,
        "roster_bytes_total": roster_total,
        "gloo_connections_per_channel": n * (n - 1) // 2,
        "state_bytes": state,
        "heal_tree_s": state / link + math.ceil(math.log2(max(n, 2))) * hop_latency_s,
        "heal_root_s": (n - 1) * state / link,
    }


def breaks_first(r):
    """The first thing that stops scaling at this size, in words."""
    if r["store_saturated"]:
        return "the store: polling needs %.0fk req/s" % (r["poll_load_rps"] / 1e3)
    if r["heal_root_s"] > 10:
        return "the state broadcast from one root (%.0f s)" % r["heal_root_s"]
    if r["gloo_connections_per_channel"] > 1e6:
        return "Gloo's full mesh (%.1fM connections)" % (r["gloo_connections_per_channel"] / 1e6)
    return "nothing yet"


def table(args):
    print("ranks  store req  poll load  store s  state MiB  heal tree s  heal root s  Gloo conns  breaks first")
    for n in args.ranks:
        r = regroup(n, args.params, args.link_gbit, args.store_rps, args.poll_ms / 1e3)
        print("%5d  %9d  %7.0fk  %7.2f  %9.0f  %11.3f  %11.1f  %10d  %s" % (
            n, r["store_requests"], r["poll_load_rps"] / 1e3, r["store_s"], r["state_bytes"] / 2**20,
            r["heal_tree_s"], r["heal_root_s"], r["gloo_connections_per_channel"], breaks_first(r)))
    # The small case measured on one box (README, Elastic jobs): resnet18 with 20 classes.
    print("measured (resnet18 with 20 classes: 11.19M parameters, shared memory): 86 MiB to each rank when the "
          "state travels whole, restored in 0.22-0.25 s; this model: %.0f MiB (3 -> 2 ranks, survivors alone: "
          "12 KiB, 0.02-0.03 s)" % (state_bytes(11.19e6) / 2**20))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("table")
    p.add_argument("--params", type=float, default=25.6e6, help="model parameters (ResNet-50: 25.6M)")
    p.add_argument("--link-gbit", type=float, default=25.0)
    p.add_argument("--store-rps", type=float, default=100000, help="requests per second the store serves")
    p.add_argument("--poll-ms", type=float, default=10.0, help="MembershipOptions::poll")
    p.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[64, 512, 4096])
    args = ap.parse_args(argv)
    table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
