#!/usr/bin/env python3
"""Tables for scripts/convergence/bench.sh: top-1 per epoch (median over seeds, then each seed) for
every side, and the median time to a target top-1 with its ratio to the PyTorch reference's.
Reads OUT/<side>.<seed>.jsonl: aiacc_train's --metrics-file ("type": "eval" lines) or
torch_ref.py's output (one line per epoch)."""
import argparse
import json
import os
import statistics


def evals(path):
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
    print(f"\ntop-1 % per epoch: median over seeds {' '.join(seeds)} (each seed in brackets)")
    print("epoch  " + "  ".join(f"{s:>26s}" for s in sides))
    for e in range(epochs):
        cells = []
        for s in sides:
            vals = [runs[(s, k)][e][2] for k in seeds if len(runs[(s, k)]) > e]
            cells.append(f"{statistics.median(vals):5.1f} [{' '.join(f'{v:.1f}' for v in vals)}]" if vals else "-")
        print(f"{e + 1:5d}  " + "  ".join(f"{c:>26s}" for c in cells))
    print(f"\ntime to {a.target:g}% top-1 (seconds from start; median over the seeds that reached it)")
    med = {}
    for s in sides:
        times = []
        for k in seeds:
            hit = [t for (_, t, top1) in runs[(s, k)] if top1 >= a.target]
            times.append(hit[0] if hit else None)
        got = [t for t in times if t is not None]
        med[s] = statistics.median(got) if got else None
        shown = " ".join("-" if t is None else f"{t:.0f}" for t in times)
        print(f"  {s:6s} {('%.1f' % med[s]) if med[s] else 'not reached':>12s}  (seeds: {shown}; "
              f"{len(got)} of {len(seeds)} reached it)")
    if med.get("torch"):
        for s in sides:
            if s != "torch" and med.get(s):
                print(f"  {s} / torch: {med[s] / med['torch']:.2f}x")


if __name__ == "__main__":
    main()
