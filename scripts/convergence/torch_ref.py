#!/usr/bin/env python3
"""The PyTorch reference for the convergence benchmark: torchvision's ResNet, ImageFolder,
RandomResizedCrop/flip and Resize/CenterCrop, SGD, with the recipe aiacc_train is given, written
as a PyTorch user would. One JSON line per epoch on stdout:
{"epoch": E, "seconds": S, "top1": T1, "top5": T5, "loss": L, "train_loss": TL}.
The learning rate follows aiacc_train's schedule: peak lr * global batch / 256, linear warmup,
then cosine to 0 over the epochs, set before every step from the fractional epoch position."""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.4, help="per 256 images")
    ap.add_argument("--warmup-epochs", type=float, default=0.0)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--weight-decay", type=float, default=5e-5)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--min-scale", type=float, default=0.35)
    ap.add_argument("--crop-fraction", type=float, default=0.875)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-top1", type=float, default=0.0, help="stop once reached (0: never)")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    train_tf = T.Compose([T.RandomResizedCrop(a.image_size, scale=(a.min_scale, 1.0)),
                          T.RandomHorizontalFlip(), T.ToTensor(), norm])
    val_tf = T.Compose([T.Resize(int(round(a.image_size / a.crop_fraction))), T.CenterCrop(a.image_size),
                        T.ToTensor(), norm])
    train_set = torchvision.datasets.ImageFolder(a.data + "/train", train_tf)
    val_set = torchvision.datasets.ImageFolder(a.data + "/val", val_tf)
    train = torch.utils.data.DataLoader(train_set, batch_size=a.batch_size, shuffle=True, drop_last=True,
                                        num_workers=a.workers, persistent_workers=a.workers > 0)
    val = torch.utils.data.DataLoader(val_set, batch_size=a.batch_size, num_workers=a.workers)
    model = getattr(torchvision.models, a.arch)(num_classes=len(train_set.classes))
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": a.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=a.lr, momentum=a.momentum, nesterov=a.nesterov)
    criterion = nn.CrossEntropyLoss(label_smoothing=a.label_smoothing)
    peak = a.lr * a.batch_size / 256.0
    steps = len(train)

    def lr_at(pos):
        if pos < a.warmup_epochs:
            return peak * pos / a.warmup_epochs
        t = min(1.0, (pos - a.warmup_epochs) / max(1e-9, a.epochs - a.warmup_epochs))
        return peak * 0.5 * (1 + math.cos(math.pi * t))

    start = time.time()
    for epoch in range(a.epochs):
        model.train()
        loss_sum, n = 0.0, 0
        for i, (x, y) in enumerate(train):
            for g in opt.param_groups:
                g["lr"] = lr_at(epoch + i / steps)
            loss = criterion(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            n += 1
        model.eval()
        c1 = c5 = count = 0
        vloss = 0.0
        with torch.no_grad():
            for x, y in val:
                out = model(x)
                vloss += nn.functional.cross_entropy(out, y, reduction="sum").item()
                top = out.topk(min(5, out.size(1)), 1).indices
                hit = top.eq(y.unsqueeze(1))
                c1 += hit[:, 0].sum().item()
                c5 += hit.any(1).sum().item()
                count += y.numel()
        rec = {"epoch": epoch + 1, "seconds": round(time.time() - start, 2), "top1": 100.0 * c1 / count,
               "top5": 100.0 * c5 / count, "loss": vloss / count, "train_loss": loss_sum / max(1, n)}
        print(json.dumps(rec), flush=True)
        if a.target_top1 > 0 and rec["top1"] >= a.target_top1:
            break


if __name__ == "__main__":
    sys.exit(main())
