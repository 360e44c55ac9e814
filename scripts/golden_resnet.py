#!/usr/bin/env python3
"""Exports a torchvision ResNet's weights, a fixed input and its output, for the C++ golden test.

Usage: golden_resnet.py ARCH NUM_CLASSES OUT_DIR
Writes OUT_DIR/weights.bin (model state, aiacc's named-tensor format: see models/weights.h),
OUT_DIR/io.bin (tensors "input", "output_eval", "output_train") and OUT_DIR/names.txt
(parameter names and shapes, one per line, in registration order).
Runs with Debian's python3-torch/python3-torchvision; exits 3 when they are absent.
"""
import struct
import sys

try:
    import torch
    import torchvision
except ImportError as e:  # the C++ test skips with this message
    print(f"python3-torchvision unavailable: {e}", file=sys.stderr)
    sys.exit(3)


def write_named(path, items):
    with open(path, "wb") as f:
        f.write(b"AIACCW01")
        f.write(struct.pack("<Q", len(items)))
        for name, t in items:
            t = t.detach().contiguous().cpu()
            if t.dtype == torch.float32:
                code = 0
            elif t.dtype == torch.int64:
                code = 1
            else:
                raise SystemExit(f"unsupported dtype {t.dtype} for {name}")
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<II", code, t.dim()))
            for d in t.shape:
                f.write(struct.pack("<q", d))
            f.write(t.numpy().tobytes())


def main():
    arch, classes, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.manual_seed(1234)
    model = getattr(torchvision.models, arch)(num_classes=classes)
    # Non-trivial BN statistics and affine parameters, so eval mode exercises them.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    state = list(model.state_dict().items())
    write_named(f"{out}/weights.bin", state)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        model.eval()
        y_eval = model(x)
        model.train()
        y_train = model(x)
    write_named(f"{out}/io.bin", [("input", x), ("output_eval", y_eval), ("output_train", y_train)])
    with open(f"{out}/names.txt", "w") as f:
        for name, p in model.named_parameters():
            f.write(name + " " + "x".join(str(d) for d in p.shape) + "\n")


if __name__ == "__main__":
    main()
