#!/usr/bin/env python3
"""Golden training run for the C++ step-equivalence test (tests/train_golden_test.cc).

Usage: golden_train.py OUT_DIR WORLD
Trains torchvision's resnet18 (10 classes) with the recipe below, as PyTorch does it, on fixed
batches (no augmentation), and writes:
  OUT_DIR/init.bin    the initial model state (aiacc's named-tensor format, models/weights.h)
  OUT_DIR/data.bin    "train_images" [K*B,3,S,S], "train_labels", "val_images", "val_labels"
  OUT_DIR/golden.bin  "loss" [steps] (the job's loss per step: the mean over every rank's images,
                      what aiacc's metrics file reports), "eval_loss"/"eval_top1" [epochs],
                      and "final.<name>" for every parameter and buffer after the last step
WORLD = 1: one process, global batch B. WORLD = 2: what DataParallel must equal, PyTorch DDP's
semantics: each rank forwards its half of every batch (BatchNorm over its half), the gradients
are averaged, both ranks step alike; running statistics are averaged across ranks before they
are read (evaluation, the final state), which aiacc's --bn-sync lazy promises.
The recipe (the C++ test configures aiacc_train's Trainer with the same): 3 epochs of K=8
batches of B=16 at 32 px; lr 0.4 per 256 (0.025 at batch 16), 0.5 epochs of linear warmup, then
cosine to 0, set before every step from the fractional epoch position; SGD with Nesterov momentum
0.9, weight decay 5e-5 on weights only (not on BN parameters and biases); cross-entropy with
label smoothing 0.1. Runs with Debian's python3-torch/python3-torchvision; exits 3 when absent.
"""
import copy
import math
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
try:
    import torch
    import torchvision
except ImportError as e:  # the C++ test skips with this message
    print(f"python3-torchvision unavailable: {e}", file=sys.stderr)
    sys.exit(3)
from golden_resnet import write_named

EPOCHS, K, B, S, CLASSES = 3, 8, 16, 32, 10
LR, WARMUP, MOMENTUM, WD, SMOOTHING = 0.4, 0.5, 0.9, 5e-5, 0.1
VAL = 24


def lr_at(pos):
    peak = LR * B / 256.0
    if pos < WARMUP:
        return peak * pos / WARMUP
    t = min(1.0, (pos - WARMUP) / (EPOCHS - WARMUP))
    return peak * 0.5 * (1.0 + math.cos(math.pi * t))


def main():
    out, world = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(20)
    torch.set_num_threads(1)
    # Learnable fixed data: the class shifts the mean of one colour channel in one quadrant.
    def make(n):
        y = torch.randint(0, CLASSES, (n,))
        x = torch.randn(n, 3, S, S)
        for i in range(n):
            c, q = int(y[i]) % 3, int(y[i]) // 3
            r0, c0 = (q // 2) * (S // 2), (q % 2) * (S // 2)
            x[i, c, r0:r0 + S // 2, c0:c0 + S // 2] += 2.0
        return x, y
    train_x, train_y = make(K * B)
    val_x, val_y = make(VAL)
    model = torchvision.models.resnet18(num_classes=CLASSES)
    write_named(f"{out}/init.bin", list(model.state_dict().items()))
    write_named(f"{out}/data.bin", [("train_images", train_x), ("train_labels", train_y),
                                    ("val_images", val_x), ("val_labels", val_y)])
    replicas = [copy.deepcopy(model) for _ in range(world)]
    opts = []
    for m in replicas:
        decay = [p for p in m.parameters() if p.dim() > 1]
        no_decay = [p for p in m.parameters() if p.dim() <= 1]
        opts.append(torch.optim.SGD([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                                    lr=LR, momentum=MOMENTUM, nesterov=True))
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=SMOOTHING)

    def average_buffers():
        with torch.no_grad():
            for bufs in zip(*[list(m.buffers()) for m in replicas]):
                if bufs[0].dtype.is_floating_point:
                    mean = sum(bufs) / len(bufs)
                    for b in bufs:
                        b.copy_(mean)

    losses, eval_loss, eval_top1 = [], [], []
    per = B // world
    for epoch in range(EPOCHS):
        for k in range(K):
            lr = lr_at(epoch + k / K)
            grads, rank_losses = [], []
            for r, (m, opt) in enumerate(zip(replicas, opts)):
                m.train()
                for g in opt.param_groups:
                    g["lr"] = lr
                lo = k * B + r * per
                loss = criterion(m(train_x[lo:lo + per]), train_y[lo:lo + per])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                grads.append([p.grad for p in m.parameters()])
                rank_losses.append(loss.item())
            # The job's loss: the mean over every rank's images (equal halves: the ranks' mean).
            losses.append(sum(rank_losses) / world)
            with torch.no_grad():
                mean = [sum(gs) / world for gs in zip(*grads)]
                for m in replicas:
                    for p, g in zip(m.parameters(), mean):
                        p.grad = g.clone()
            for opt in opts:
                opt.step()
        average_buffers()
        m = replicas[0]
        m.eval()
        with torch.no_grad():
            logits = m(val_x)
            eval_loss.append(torch.nn.functional.cross_entropy(logits, val_y).item())
            eval_top1.append(100.0 * (logits.argmax(1) == val_y).float().mean().item())
    average_buffers()
    final = [("final." + n, t) for n, t in replicas[0].state_dict().items()]
    write_named(f"{out}/golden.bin", [("loss", torch.tensor(losses)), ("eval_loss", torch.tensor(eval_loss)),
                                      ("eval_top1", torch.tensor(eval_top1))] + final)


if __name__ == "__main__":
    main()
