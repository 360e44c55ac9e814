#!/usr/bin/env python3
"""aiacc scaling model: step time and scaling efficiency of data-parallel training, from the
per-bucket backward compute times of a real run and a network description.

  simulate.py profile TIMELINE.json [--last N]           the compute profile a timeline shows
  simulate.py predict TIMELINE.json --nodes N --per-node R --inter-gbit X [--intra-gbit Y]
                      [--fp16] [--two-level] [--streams K] [--no-overlap] [...]
  simulate.py validate DIR [--tolerance 0.15]            lab runs kept by bench_lab.sh --save:
                                                         predicted against measured step times
  simulate.py table [--profile TIMELINE.json]            ResNet-50 at 8..512 GPUs, seed scenarios
  simulate.py plot --out scaling.png [--profile ...]     predicted efficiency against GPU count

The model, per step:
  compute   forward, backward and optimizer times and, for every bucket, when backward had its
            gradients ready (offset from backward start) and its size: all read from a timeline
            (aiacc_train --timeline: spans "forward", "backward", "optimizer", instants
            "bucket ready"), the median over the last steps (after tuning).
  a bucket  is reduced as soon as it is ready and the communicators are free (overlap), in plan
            order. Flat ring over P ranks in node-major order: every link carries 2(P-1)/P of the
            bucket, so the slowest link (a node's egress, when there are several nodes) sets the
            time, plus 2(P-1) latencies. Two-level: a ring reduce-scatter inside the node
            ((R-1)/R of the bucket over the intra-node link), R parallel rings between nodes on
            1/R of it each (together 2(N-1)/N of the bucket through each node's egress), and an
            allgather inside the node; the three stages pipeline across buckets. fp16 halves
            the bytes. K streams: a single connection moves at most --stream-gbit, so a link is
            used at min(link, K x stream) (x R for the two-level inter-node stage, whose R rings
            run side by side). The CPU cost of reductions: every byte a rank sends is also read,
            added and written (--reduce-gbps).
  stragglers every rank waits for the slowest: with per-step compute varying by a coefficient of
            variation cv between ranks, the slowest of P is later by cv x E[max of P standard
            normals] (0.56 for 2, 1.03 for 4, 3.04 for 512), so compute stretches by that
            factor. A timeline gives cv as the spread of its own steps' compute (ranks are alike).
  step      forward + max(backward, last bucket reduced) + optimizer + the rest of the loop
            (data, bookkeeping) as measured. Without overlap (central negotiation) reduction
            starts when backward ends.
Efficiency at N GPUs = step time alone / step time at N (the same per-GPU batch); speedup = N x
efficiency. No third-party modules: Debian's python3 and, for plot only, PIL.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys


# ---- Compute profile from a timeline ---------------------------------------------------------

class Profile:
    """One representative step: seconds of forward, backward, optimizer, other; buckets as
    (ready offset into backward in seconds, bytes of fp32 gradients); cv: the coefficient of
    variation of forward + backward over the steps it was measured on."""

    def __init__(self, fwd, bwd, opt, other, buckets, cv=0.0):
        self.fwd, self.bwd, self.opt, self.other = fwd, bwd, opt, other
        self.buckets = list(buckets)
        self.cv = cv

    def compute(self):
        return self.fwd + self.bwd + self.opt + self.other

    def scaled(self, compute_s):
        """The same shape with forward + backward + optimizer taking compute_s seconds."""
        k = compute_s / (self.fwd + self.bwd + self.opt)
        return Profile(self.fwd * k, self.bwd * k, self.opt * k, 0.0,
                       [(t * k, b) for t, b in self.buckets])

    def gradient_bytes(self):
        return sum(b for _, b in self.buckets)

    def to_json(self):
        return {"forward_s": self.fwd, "backward_s": self.bwd, "optimizer_s": self.opt,
                "other_s": self.other, "compute_cv": self.cv, "buckets": [{"ready_s": t, "bytes": b} for t, b in self.buckets]}


def load_events(path):
    with open(path) as f:
        return json.load(f)


def profile_from_timeline(events, last=None):
    """Mean step of the last `last` steps (all when None) of rank 0's timeline (means, as the
    throughput it is compared with is a mean); bucket offsets are medians."""
    row0 = sorted((e for e in events if e.get("tid") == 0 and e.get("ph") in ("X", "i")),
                  key=lambda e: e["ts"])
    steps, cur = [], None
    for e in row0:
        name = e["name"]
        if e["ph"] == "X" and name == "forward":
            cur = {"fwd": e, "buckets": []}
            steps.append(cur)
        elif cur is None:
            continue
        elif e["ph"] == "X" and name == "backward":
            cur["bwd"] = e
        elif e["ph"] == "X" and name.startswith("gradient sync wait"):
            cur["sync"] = e
        elif e["ph"] == "X" and name == "optimizer":
            cur["opt"] = e
        elif e["ph"] == "i" and name == "bucket ready":
            cur["buckets"].append(e)
    steps = [s for s in steps if "bwd" in s and "opt" in s]
    if not steps:
        raise ValueError("no complete steps (forward, backward, optimizer spans) in the timeline")
    # The rest of the loop: from the end of one step's optimizer to the next forward.
    for a, b in zip(steps, steps[1:]):
        a["other"] = max(0.0, b["fwd"]["ts"] - (a["opt"]["ts"] + a["opt"]["dur"])) / 1e6
    if len(steps) > 1:
        steps = steps[:-1]  # the last step has no successor to measure its "other" by
    else:
        steps[0]["other"] = 0.0
    if last:
        steps = steps[-last:]
    med, mean = statistics.median, statistics.fmean
    fwd = mean([s["fwd"]["dur"] / 1e6 for s in steps])
    bwd = mean([s["bwd"]["dur"] / 1e6 for s in steps])
    opt = mean([s["opt"]["dur"] / 1e6 for s in steps])
    other = mean([s["other"] for s in steps])
    compute = [(s["fwd"]["dur"] + s["bwd"]["dur"]) / 1e6 for s in steps]
    cv = statistics.pstdev(compute) / statistics.fmean(compute) if len(compute) > 1 else 0.0
    # Bucket offsets: per bucket position, the median over the steps with the modal bucket count.
    counts = [len(s["buckets"]) for s in steps]
    n = max(set(counts), key=counts.count)
    same = [s for s in steps if len(s["buckets"]) == n]
    buckets = []
    for k in range(n):
        offs = [min(s["buckets"][k]["ts"] - s["bwd"]["ts"], s["bwd"]["dur"]) / 1e6 for s in same]
        buckets.append((max(0.0, med(offs)), int(same[0]["buckets"][k]["args"]["bytes"])))
    return Profile(fwd, bwd, opt, other, buckets, cv)


def expected_max_normal(p):
    """E[max of p independent standard normal draws], by numerical integration."""
    if p <= 1:
        return 0.0
    phi = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    Phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))
    h, total, x = 0.01, 0.0, -8.0
    while x < 8.0:
        total += x * p * phi(x) * Phi(x) ** (p - 1) * h
        x += h
    return total


# ---- Network model ---------------------------------------------------------------------------

class Net:
    """Bandwidths in Gbit/s, latencies in microseconds per ring step."""

    def __init__(self, nodes, per_node, inter_gbit, intra_gbit=100.0, inter_lat_us=50.0,
                 intra_lat_us=10.0, stream_gbit=0.0, reduce_gbps=0.0, jitter_cv=None):
        self.nodes, self.per_node = nodes, per_node
        self.inter = inter_gbit * 1e9 / 8
        self.intra = intra_gbit * 1e9 / 8
        self.inter_lat, self.intra_lat = inter_lat_us * 1e-6, intra_lat_us * 1e-6
        self.stream = stream_gbit * 1e9 / 8 if stream_gbit > 0 else float("inf")
        self.reduce = reduce_gbps * 1e9 if reduce_gbps > 0 else float("inf")
        self.jitter_cv = jitter_cv  # None: the profile's own

    @property
    def ranks(self):
        return self.nodes * self.per_node

    def straggle(self, profile_cv=0.0):
        """Factor by which the slowest of the ranks' compute exceeds the typical one."""
        cv = profile_cv if self.jitter_cv is None else self.jitter_cv
        return 1.0 + cv * expected_max_normal(self.ranks)


class Config:
    def __init__(self, fp16=False, two_level=False, streams=1, overlap=True):
        self.fp16, self.two_level, self.streams, self.overlap = fp16, two_level, streams, overlap

    def name(self):
        parts = ["two-level" if self.two_level else "flat", "fp16" if self.fp16 else "fp32"]
        if self.streams > 1:
            parts.append(f"{self.streams} streams")
        if not self.overlap:
            parts.append("no overlap")
        return " ".join(parts)


def stage_times(nbytes, net, cfg):
    """Seconds of each pipelined stage reducing one bucket of nbytes (fp32 bytes)."""
    P, N, R = net.ranks, net.nodes, net.per_node
    if P == 1:
        return []
    wire = nbytes / 2 if cfg.fp16 else nbytes
    K = max(1, cfg.streams)

    def ring(parts, link, lat, nbytes_):
        # parts ranks; 2(parts-1)/parts of nbytes_ through every link; each rank's CPU also
        # reads, adds and writes what it receives.
        moved = 2 * (parts - 1) / parts * nbytes_
        return moved / link + 2 * (parts - 1) * lat + moved / net.reduce

    if cfg.two_level and N > 1 and R > 1:
        intra = min(net.intra, K * net.stream)
        inter = min(net.inter, R * K * net.stream)
        moved = (R - 1) / R * wire
        t_rs = moved / intra + (R - 1) * net.intra_lat + moved / net.reduce
        # R rings side by side, each over 1/R of the bucket: their sum through the node's egress.
        t_inter = ring(N, inter, net.inter_lat, wire)
        t_ag = moved / intra + (R - 1) * net.intra_lat
        return [t_rs, t_inter, t_ag]
    link = min(net.inter if N > 1 else net.intra, K * net.stream)
    lat = net.inter_lat if N > 1 else net.intra_lat
    return [ring(P, link, lat, wire)]


def step_time(profile, net, cfg):
    """(step seconds, exposed communication seconds)."""
    k = net.straggle(profile.cv)
    if k != 1.0:
        profile = Profile(profile.fwd * k, profile.bwd * k, profile.opt, profile.other,
                          [(t * k, b) for t, b in profile.buckets])
    free = []
    end = 0.0
    for ready, nbytes in profile.buckets:
        t = ready if cfg.overlap else profile.bwd
        stages = stage_times(nbytes, net, cfg)
        if len(free) < len(stages):
            free += [0.0] * (len(stages) - len(free))
        for s, dur in enumerate(stages):
            t = max(t, free[s]) + dur
            free[s] = t
        end = max(end, t)
    exposed = max(0.0, end - profile.bwd)
    if not cfg.overlap and net.ranks > 1:
        # The coordinator: rank 0 gathers readiness and broadcasts the decision, two small
        # collectives (P-1 hops each) before any reduction starts.
        exposed += 2 * (net.ranks - 1) * (net.inter_lat if net.nodes > 1 else net.intra_lat)
    return profile.fwd + profile.bwd + exposed + profile.opt + profile.other, exposed


def efficiency(profile, net, cfg):
    alone = profile.compute()
    step, _ = step_time(profile, net, cfg)
    return alone / step


# ---- Lab validation --------------------------------------------------------------------------

# What the lab's links and loopback do, measured there (aiacc_bench allreduce): a node's egress
# runs at the tbf rate; inside a node, ranks share two cores, so loopback moves ~9 Gbit/s and
# Gloo's per-step latency is ~0.3 ms; each byte a rank reduces costs CPU time at ~2 GB/s.
LAB = dict(intra_gbit=9.0, inter_lat_us=300.0, intra_lat_us=300.0, reduce_gbps=2.0)


def rate_gbit(s):
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", s.strip().lower())
    if not m:
        raise ValueError(f"cannot read link rate '{s}'")
    return float(m.group(1)) * {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1.0}[m.group(2)]


def config_from_report(report):
    comm = report.get("comm", "")
    streams = re.search(r"over (\d+) channel", comm)
    return Config(fp16="fp16 transfer" in comm, two_level=comm.startswith("two-level"),
                  streams=int(streams.group(1)) if streams else 1, overlap=True)


def validate(folder, tolerance, last):
    rows = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".meta"):
            continue
        run = name[:-5]
        text = open(os.path.join(folder, name)).read()
        head, _, flags = text.partition(" flags=")
        meta = dict(kv.split("=", 1) for kv in head.split())
        try:
            report = json.load(open(os.path.join(folder, run + ".report.json")))
            events = load_events(os.path.join(folder, run + ".timeline.json"))
        except (OSError, ValueError) as e:
            print(f"{run}: skipped ({e})", file=sys.stderr)
            continue
        nodes, per = int(meta["nodes"]), int(meta["per_node"])
        world, batch = nodes * per, int(meta["batch"])
        if report.get("steady_images_per_s", 0) <= 0:
            continue
        measured = batch * world / report["steady_images_per_s"]
        cfg = config_from_report(report)
        cfg.overlap = "central" not in flags
        net = Net(nodes, per, rate_gbit(meta["bw"]), **LAB)
        # The steps the measured rate covers: the bench's timed steps (the run's last ones),
        # named in the .meta since lab runs save it; --last for older runs.
        window = int(meta.get("steps", last))
        profile = profile_from_timeline(events, window)
        predicted, exposed = step_time(profile, net, cfg)
        err = predicted / measured - 1
        rows.append((run, f"{nodes}x{per} {meta['bw']} {meta['arch']}@{meta['size']}", cfg.name(),
                     measured, predicted, exposed, err))
    if not rows:
        print(f"no lab runs in {folder} (scripts/bench_lab.sh --save {folder})", file=sys.stderr)
        return 1
    print(f"{'run':8} {'layout':28} {'configuration':26} {'measured s':>10} {'predicted':>10} "
          f"{'exposed':>8} {'error':>7}")
    worst = 0.0
    for run, layout, cname, m, p, x, err in rows:
        worst = max(worst, abs(err))
        print(f"{run:8} {layout:28} {cname:26} {m:10.3f} {p:10.3f} {x:8.3f} {100 * err:+6.1f}%")
    ok = worst <= tolerance
    print(f"validation: {len(rows)} runs, worst error {100 * worst:.1f}% "
          f"({'within' if ok else 'OUTSIDE'} {100 * tolerance:.0f}%)")
    return 0 if ok else 1


# ---- Seed scenarios --------------------------------------------------------------------------

def resnet50_profile():
    """ResNet-50's gradient buckets under aiacc's defaults (25 MiB cap, 1 MiB first bucket) and
    when backward produced them, as fractions of backward, with forward:backward:optimizer, all
    read from an aiacc_train timeline (resnet50 @128, 2 nodes x 2 ranks on the lab; `simulate.py
    profile` of it). Used when no --profile timeline is given."""
    fwd, bwd, opt = 5.376, 13.087, 0.088
    # (fraction of backward elapsed when ready, bytes): fc bias alone (the small first bucket),
    # then fc weight with layer4, ..., down to conv1.
    buckets = [(0.004, 4000), (0.059, 26058752), (0.104, 17850368), (0.209, 25200640),
               (0.471, 24449024), (0.984, 8665344)]
    return Profile(fwd, bwd, opt, 0.0, [(f * bwd, b) for f, b in buckets])


SCENARIOS = [
    dict(name="P100 nodes (8 GPUs), 25 Gbit/s", gpu="P100", ips=230.0, batch=64,
         note="~230 img/s fp32 per P100 (NVIDIA's published ResNet-50 figures), batch 64",
         net=dict(inter_gbit=25.0, intra_gbit=80.0, inter_lat_us=30.0, intra_lat_us=8.0,
                  stream_gbit=10.0, jitter_cv=0.02),
         published=(512, 462.0)),
    dict(name="V100 nodes (8 GPUs), 32 Gbit/s", gpu="V100", ips=1200.0, batch=256,
         note="~1,200 img/s per V100 with mixed precision (NVIDIA's published figure), batch 256",
         net=dict(inter_gbit=32.0, intra_gbit=800.0, inter_lat_us=30.0, intra_lat_us=5.0,
                  stream_gbit=10.0, jitter_cv=0.02),
         published=None),
]

CONFIGS = [Config(False, False, 1), Config(True, False, 1), Config(False, True, 1),
           Config(True, True, 1), Config(True, True, 4)]


def scenario_curve(profile, sc, cfg, gpus):
    prof = profile.scaled(sc["batch"] / sc["ips"])
    out = []
    for n in gpus:
        nodes, per = (1, n) if n <= 8 else (n // 8, 8)
        out.append(efficiency(prof, Net(nodes, per, **sc["net"]), cfg) if n > 1 else 1.0)
    return out


def table(profile):
    gpus = [8, 64, 128, 512]
    for sc in SCENARIOS:
        prof = profile.scaled(sc["batch"] / sc["ips"])
        n = sc["net"]
        print(f"\n{sc['name']}: ResNet-50, {sc['note']}; step compute {1e3 * prof.compute():.0f} ms; "
              f"gradients {profile.gradient_bytes() / 2**20:.0f} MiB in {len(profile.buckets)} buckets; "
              f"intra-node {n['intra_gbit']:.0f} Gbit/s, per-connection cap {n['stream_gbit']:.0f} Gbit/s, "
              f"latency {n['inter_lat_us']:.0f} us per hop between nodes, compute jitter "
              f"{100 * n['jitter_cv']:.0f}% between ranks")
        print(f"{'configuration':28}" + "".join(f"{g:>10} GPUs" for g in gpus))
        for cfg in CONFIGS:
            effs = scenario_curve(profile, sc, cfg, gpus)
            print(f"{cfg.name():28}" + "".join(f"{100 * e:7.1f}% {g * e:5.0f}x" for g, e in zip(gpus, effs)))
        if sc["published"]:
            g, x = sc["published"]
            best = max(scenario_curve(profile, sc, c, [g])[0] for c in CONFIGS)
            print(f"published: {x:.0f}x on {g} {sc['gpu']}s ({100 * x / g:.1f}%); the model's best "
                  f"configuration: {g * best:.0f}x ({100 * best:.1f}%)")


def plot(profile, out):
    from PIL import Image, ImageDraw
    gpus = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    W, H, M = 560, 380, 60
    colors = [(200, 60, 60), (230, 140, 30), (60, 120, 200), (40, 160, 80), (120, 60, 170)]
    img = Image.new("RGB", (W * len(SCENARIOS), H + 110), "white")
    d = ImageDraw.Draw(img)
    for i, sc in enumerate(SCENARIOS):
        x0 = i * W
        X = lambda g, x0=x0: x0 + M + (W - M - 20) * math.log2(g) / math.log2(512)
        Y = lambda e: 30 + (H - 30 - M) * (1 - e)
        d.text((x0 + M, 8), f"ResNet-50, {sc['name']}: predicted scaling efficiency", fill="black")
        for e in (0.0, 0.25, 0.5, 0.75, 1.0):
            d.line([(X(1) - 4, Y(e)), (X(512), Y(e))], fill=(225, 225, 225) if e else "black")
            d.text((x0 + 18, Y(e) - 6), f"{int(100 * e)}%", fill="black")
        d.line([(X(1), Y(0)), (X(1), Y(1))], fill="black")
        for g in gpus:
            d.text((X(g) - 8, Y(0) + 6), str(g), fill="black")
        d.text((x0 + M + 150, Y(0) + 24), "GPUs (log scale)", fill="black")
        for c, cfg in enumerate(CONFIGS):
            effs = scenario_curve(profile, sc, cfg, gpus)
            d.line([(X(g), Y(min(1.0, e))) for g, e in zip(gpus, effs)], fill=colors[c], width=2)
            d.text((x0 + M, H + 10 + 14 * c), cfg.name(), fill=colors[c])
        if sc["published"]:
            g, x = sc["published"]
            px, py = X(g), Y(x / g)
            d.rectangle([px - 4, py - 4, px + 4, py + 4], outline="black")
            d.text((px - 150, py + 8), f"published {x:.0f}x ({100 * x / g:.1f}%)", fill="black")
    img.save(out)
    print(f"wrote {out}")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile")
    p.add_argument("timeline")
    p.add_argument("--last", type=int, default=10)
    p = sub.add_parser("predict")
    p.add_argument("timeline")
    p.add_argument("--last", type=int, default=10)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--per-node", type=int, required=True)
    p.add_argument("--inter-gbit", type=float, required=True)
    p.add_argument("--intra-gbit", type=float, default=100.0)
    p.add_argument("--inter-lat-us", type=float, default=50.0)
    p.add_argument("--intra-lat-us", type=float, default=10.0)
    p.add_argument("--stream-gbit", type=float, default=0.0)
    p.add_argument("--reduce-gbps", type=float, default=0.0)
    p.add_argument("--jitter-cv", type=float, default=None,
                   help="compute spread between ranks (default: the timeline's own)")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--two-level", action="store_true")
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--no-overlap", action="store_true")
    p = sub.add_parser("validate")
    p.add_argument("folder")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--last", type=int, default=10)
    for name in ("table", "plot"):
        p = sub.add_parser(name)
        p.add_argument("--profile", help="timeline of a ResNet-50 run (default: built-in profile)")
        if name == "plot":
            p.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "profile":
        print(json.dumps(profile_from_timeline(load_events(a.timeline), a.last).to_json(), indent=1))
    elif a.cmd == "predict":
        prof = profile_from_timeline(load_events(a.timeline), a.last)
        net = Net(a.nodes, a.per_node, a.inter_gbit, a.intra_gbit, a.inter_lat_us, a.intra_lat_us,
                  a.stream_gbit, a.reduce_gbps, a.jitter_cv)
        cfg = Config(a.fp16, a.two_level, a.streams, not a.no_overlap)
        step, exposed = step_time(prof, net, cfg)
        print(f"{cfg.name()}: step {1e3 * step:.1f} ms (compute {1e3 * prof.compute():.1f} ms, exposed "
              f"communication {1e3 * exposed:.1f} ms), scaling efficiency {100 * prof.compute() / step:.1f}%")
    elif a.cmd == "validate":
        return validate(a.folder, a.tolerance, a.last)
    else:
        prof = profile_from_timeline(load_events(a.profile)) if a.profile else resnet50_profile()
        if a.cmd == "table":
            table(prof)
        else:
            plot(prof, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
