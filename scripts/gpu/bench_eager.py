#!/usr/bin/env python3
"""PyTorch eager reference for the GPU benchmark: torchvision ResNet-50 trained on one GPU with
synthetic data already on the device, autocast fp16, GradScaler, channels_last, cuDNN benchmark,
SGD with momentum and weight decay, label smoothing 0.1 -- what aiacc_train --gpus 1 --data
synthetic does. Prints the steady images/s (after warm-up steps, timed between synchronizations).

  python3 scripts/gpu/bench_eager.py [--batch-size 256] [--steps 60] [--image-size 224]
Also runs on the CPU for a smoke test (--device cpu: bf16 autocast, no scaler).
"""
import argparse
import time

import torch
import torchvision


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, a.arch)(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0}],
                          lr=0.1, momentum=0.9)
    amp_dtype = torch.float16 if cuda else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda", enabled=cuda) if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler") \
        else torch.cuda.amp.GradScaler(enabled=cuda)
    crit = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    x = torch.randn(a.batch_size, 3, a.image_size, a.image_size, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch_size,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=amp_dtype):
            loss = crit(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(a.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    loss.item()
    sync()
    dt = time.perf_counter() - t0
    ips = a.batch_size * a.steps / dt
    print(f"eager {a.arch} bs{a.batch_size}@{a.image_size} on {dev} ({torch.__version__}): "
          f"{a.steps} steps in {dt:.2f} s, steady {ips:.1f} images/s, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
