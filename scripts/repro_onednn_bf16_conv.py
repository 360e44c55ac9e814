#!/usr/bin/env python3
"""The LibTorch defect behind issue 26, outside aiacc: a bf16 convolution's weight gradient on the CPU
(autocast -> oneDNN) is wrong when a 3x3, stride-2, padding-1 convolution meets an input one pixel
wide (1x1, 2x1, ...).

The kernel's taps that meet only padding have a gradient of exactly 0 in fp32. oneDNN's bf16 backward
returns garbage for them instead, which depends on what the heap held (here it is filled with NaN and
freed before each backward), often inf or NaN. ResNet has this convolution in layer4's first block at
16 px, where a NaN gradient turns the next forward into a NaN loss (0 x NaN at the padding). aiacc
runs that convolution in fp32, which is right for these shapes (models/resnet.cc, strided3x3).

Seen with Debian's torch 1.13 (oneDNN 2.6.3) and pip's torch 2.11 (oneDNN 3.10.2), on AMX and, with
ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, on AVX512-BF16 kernels alike. Inputs one pixel high (1x2) and the
other shapes below are right.

  /usr/bin/python3 scripts/repro_onednn_bf16_conv.py            # Debian's torch 1.13
  .venv-torch2/bin/python scripts/repro_onednn_bf16_conv.py     # torch 2.11 (scripts/setup.sh)

Prints one line per case and exits 1 when a case is wrong.
"""
import os
import sys

import torch


def worst_error(kernel, stride, padding, height, width, bf16, reps=10):
    conv = torch.nn.Conv2d(256, 512, kernel, stride=stride, padding=padding, bias=False)
    x = torch.randn(8, 256, height, width)
    conv(x).square().sum().backward()
    ref = conv.weight.grad.double().clone()
    worst = 0.0
    for _ in range(reps):
        junk = [torch.full((n,), float("nan")) for n in (1 << 12, 1 << 16, 1 << 20, 1 << 22)]
        del junk  # the heap now holds NaN where the next tensors go
        conv.weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = conv(x)
        y.float().square().sum().backward()
        err = float((conv.weight.grad.double() - ref).norm() / ref.norm())
        worst = float("inf") if err != err else max(worst, err)
    return worst


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    wrong = 0
    cases = [(3, 2, 1, 1, 1), (3, 2, 1, 2, 1), (3, 2, 1, 1, 2), (3, 1, 1, 1, 1), (1, 2, 0, 1, 1), (3, 2, 1, 2, 2),
             (3, 2, 1, 4, 4)]
    for kernel, stride, padding, height, width in cases:
        err = worst_error(kernel, stride, padding, height, width, bf16=True)
        bad = not err < 0.02  # bf16 keeps about 3 significant digits
        wrong += bad
        print(f"torch {torch.__version__}, ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}: "
              f"bf16 conv {kernel}x{kernel} stride {stride} padding {padding} on {height}x{width}: weight gradient "
              f"off fp32's by {err:.3g} (relative, worst of 10){'  <-- WRONG' if bad else ''}", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
