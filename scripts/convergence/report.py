#!/usr/bin/env python3
"""Tables for scripts/convergence/bench.sh: top-1 per epoch (median over seeds, then each seed) for
every side, with the two-sided rank-sum (Mann-Whitney) p-value of each side against the PyTorch
reference at that epoch; seconds per epoch; and the median time to a target top-1 with its ratio
to the PyTorch reference's.

The time to target is a median over all seeds, a seed that never reached the target counting as
infinitely late: if most seeds of a side miss it, its median is "not reached". (A median over only
the seeds that reached it would favour a side that rarely gets there, but fast when it does.)

Reads OUT/<side>.<seed>.jsonl: aiacc_train's --metrics-file ("type": "eval" lines) or
torch_ref.py's output (one line per epoch)."""
import argparse
import json
import math
import os
import statistics


def evals(path):
    """[(epoch, seconds, top1)] of one run, in order; [] when the file is missing."""
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("type", "eval") != "eval":
            continue
        out.append((float(r["epoch"]), float(r["seconds"]), float(r["top1"])))
    return out


def time_to_target(run, target):
    """Seconds at the first evaluation with top-1 >= target, or None."""
    return next((t for (_, t, top1) in run if top1 >= target), None)


def median_time(times):
    """Median of times with None as infinitely late; None when the median seed never got there."""
    if not times:
        return None
    m = statistics.median([math.inf if t is None else t for t in times])
    return None if math.isinf(m) else m


def rank_sum_p(a, b):
    """Exact two-sided p-value of the Wilcoxon rank-sum (Mann-Whitney) test of samples a and b:
    the chance, under exchangeability, of a rank sum of a at least as far from its mean as the
    one observed. Ties get mid-ranks; the null distribution is counted exactly over all
    C(len(a)+len(b), len(a)) splits of the pooled (doubled, hence integer) mid-ranks."""
    m, n = len(a), len(b)
    if m == 0 or n == 0:
        return 1.0
    pooled = sorted(a + b)
    rank2 = {}  # value -> 2 x mid-rank (1-based)
    i = 0
    while i < len(pooled):
        j = i
        while j < len(pooled) and pooled[j] == pooled[i]:
            j += 1
        rank2[pooled[i]] = i + 1 + j  # 2 x ((i + 1 + j) / 2)
        i = j
    ranks = [rank2[v] for v in pooled]
    observed = sum(rank2[v] for v in a)
    mean = m * sum(ranks) / (m + n)
    # ways[k][s]: subsets of k of the ranks seen so far with doubled rank sum s.
    total = sum(ranks)
    ways = [[0] * (total + 1) for _ in range(m + 1)]
    ways[0][0] = 1
    for r in ranks:
        for k in range(min(m, len(ranks)), 0, -1):
            row, prev = ways[k], ways[k - 1]
            for s in range(total, r - 1, -1):
                if prev[s - r]:
                    row[s] += prev[s - r]
    far = abs(observed - mean) - 1e-9
    hits = sum(c for s, c in enumerate(ways[m]) if abs(s - mean) >= far)
    return hits / math.comb(m + n, m)


def seconds_per_epoch(run):
    """Wall seconds per epoch, start-up included: the last evaluation's time over its epoch."""
    return run[-1][1] / run[-1][0] if run and run[-1][0] > 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", required=True)
    ap.add_argument("--sides", required=True)
    ap.add_argument("--target", type=float, required=True)
    a = ap.parse_args()
    seeds, sides = a.seeds.split(), a.sides.split()
    runs = {(s, k): evals(os.path.join(a.out, f"{s}.{k}.jsonl")) for s in sides for k in seeds}
    epochs = max((len(v) for v in runs.values()), default=0)
    ref = "torch" if "torch" in sides else None
    print(f"\ntop-1 % per epoch: median over seeds {' '.join(seeds)} (each seed in brackets)"
          + (f"; p: two-sided rank-sum test against {ref}'s seeds" if ref else ""))
    print("epoch  " + "  ".join(f"{s:>26s}" for s in sides))

    def at(side, e):
        return [runs[(side, k)][e][2] for k in seeds if len(runs[(side, k)]) > e]

    for e in range(epochs):
        cells = []
        for s in sides:
            vals = at(s, e)
            cell = f"{statistics.median(vals):5.1f} [{' '.join(f'{v:.1f}' for v in vals)}]" if vals else "-"
            if ref and s != ref and vals and at(ref, e):
                cell += f" p={rank_sum_p(vals, at(ref, e)):.2f}"
            cells.append(cell)
        print(f"{e + 1:5d}  " + "  ".join(f"{c:>26s}" for c in cells))

    print("\nseconds per epoch (median over seeds, start-up included)")
    spe = {}
    for s in sides:
        vals = [v for v in (seconds_per_epoch(runs[(s, k)]) for k in seeds) if v is not None]
        spe[s] = statistics.median(vals) if vals else None
    for s in sides:
        ratio = f"  {spe[s] / spe[ref]:.2f}x {ref}'s" if ref and s != ref and spe[s] and spe.get(ref) else ""
        print(f"  {s:6s} {('%.2f' % spe[s]) if spe[s] else '-':>8s}{ratio}")

    print(f"\ntime to {a.target:g}% top-1 (seconds from start; median over all seeds, a seed that "
          "never reached it counting as infinitely late)")
    med = {}
    for s in sides:
        times = [time_to_target(runs[(s, k)], a.target) for k in seeds]
        med[s] = median_time(times)
        shown = " ".join("-" if t is None else f"{t:.0f}" for t in times)
        reached = sum(t is not None for t in times)
        print(f"  {s:6s} {('%.1f' % med[s]) if med[s] else 'not reached':>12s}  (seeds: {shown}; "
              f"{reached} of {len(times)} reached it)")
    if ref:
        for s in sides:
            if s == ref:
                continue
            if med.get(s) and med.get(ref):
                print(f"  {s} / {ref}: {med[s] / med[ref]:.2f}x")
            elif med.get(s):
                print(f"  {s} / {ref}: {ref}'s median seed never reached {a.target:g}%")


if __name__ == "__main__":
    main()
