#!/usr/bin/env python3
"""torchvision's input pipeline on one thread, the reference peer for aiacc_bench data.

Usage: bench_data.py DIR SIZE [IMAGES]
ImageFolder + RandomResizedCrop(SIZE) + RandomHorizontalFlip + ToTensor + Normalize, the standard
ImageNet training transform, timed over the same files aiacc_bench reads (DIR/train).
Prints one line: "torchvision data: N images at S px: X images/s per thread".
"""
import os
import sys
import time

import torch
import torchvision
import torchvision.transforms as T


def main():
    root, size = sys.argv[1], int(sys.argv[2])
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    torch.set_num_threads(1)
    train = os.path.join(root, "train")
    tf = T.Compose([
        T.RandomResizedCrop(size),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = torchvision.datasets.ImageFolder(train if os.path.isdir(train) else root, transform=tf)
    n = len(ds) if limit <= 0 else min(limit, len(ds))
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0))[:n].tolist()
    for i in order[:16]:  # warm-up, not timed
        ds[i]
    t0 = time.perf_counter()
    for i in order:
        ds[i]
    s = time.perf_counter() - t0
    print(f"torchvision data: {n} images at {size} px: {n / s:.1f} images/s per thread")


if __name__ == "__main__":
    main()
