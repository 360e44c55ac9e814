#!/usr/bin/env python3
"""PyTorch DDP reference peer: the same training step aiacc_train runs, on synthetic data.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (set by bench_ddp.sh).
Usage: ddp_peer.py ARCH BATCH SIZE STEPS THREADS [fp16] [no-buffer-broadcast]
torchvision ARCH, SGD momentum 0.9 nesterov, label smoothing 0.1, gloo backend, one fixed random
batch per rank (no I/O). Rank 0 prints "ddp: X images/s" over the steps after 3 warm-up steps,
and "ddp-rss: Y MiB", the largest peak resident memory of any rank.
With "fp16", gradients travel through DDP's fp16 compression hook; with "no-buffer-broadcast",
DDP(broadcast_buffers=False): no broadcast of rank 0's BN statistics before each forward.
"""
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    arch, batch, size, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    options = set(sys.argv[6:])
    unknown = options - {"fp16", "no-buffer-broadcast"}
    if unknown:
        sys.exit(f"ddp_peer: unknown option(s) {sorted(unknown)}; expected fp16, no-buffer-broadcast")
    model = DDP(getattr(torchvision.models, arch)(num_classes=1000),
                broadcast_buffers="no-buffer-broadcast" not in options)
    if "fp16" in options:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, 3, size, size, generator=g)
    y = torch.randint(0, 1000, (batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    for i in range(steps + 3):
        if i == 3:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    dist.barrier()
    s = time.perf_counter() - t0
    # Peak resident memory, the largest over ranks (ru_maxrss is in KiB on Linux).
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0], dtype=torch.float64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"ddp: {steps * batch * world / s:.1f} images/s")
        print(f"ddp-rss: {rss.item():.0f} MiB")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
