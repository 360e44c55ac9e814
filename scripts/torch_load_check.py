#!/usr/bin/env python3
"""Loads a state dict aiacc wrote (--save-weights X.pt) the way PyTorch users do, for the C++ test.

Usage: torch_load_check.py WEIGHTS.pt ARCH NUM_CLASSES OUT.pt
torch.load(WEIGHTS, weights_only=True) must give a dict; torchvision's ARCH(num_classes=NUM_CLASSES)
must take it with load_state_dict(strict=True) and list the same keys in the same order. Then one
fixed input (seeded) goes through the model in eval mode, and OUT.pt gets
torch.save({"input": x, "output": y}) as a plain dict, for the test to compare with aiacc's output;
OUT.plain.pt and OUT.ordered.pt get the model's state dict as a dict and as the OrderedDict.
Exits 3 when torch or torchvision is missing (the C++ test skips with the message).
"""
import sys

try:
    import torch
    import torchvision
except ImportError as e:
    print(f"torch/torchvision unavailable: {e}", file=sys.stderr)
    sys.exit(3)


def main():
    weights, arch, classes, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    sd = torch.load(weights, weights_only=True)
    if type(sd) is not dict:
        raise SystemExit(f"torch.load gave {type(sd).__name__}, not a dict")
    model = getattr(torchvision.models, arch)(num_classes=classes)
    want = list(model.state_dict().keys())
    if list(sd.keys()) != want:
        raise SystemExit(f"keys differ from torchvision's: {sorted(set(sd) ^ set(want))[:5]} (or their order)")
    for name, t in sd.items():
        if t.requires_grad:
            raise SystemExit(f"{name} was saved with requires_grad")
    model.load_state_dict(sd, strict=True)
    model.eval()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        y = model(x)
    torch.save({"input": x, "output": y}, out)
    # What users hand to --init-weights: the state dict as a plain dict (read), and as the
    # OrderedDict model.state_dict() is (refused with the command that re-saves it).
    base = out[: -len(".pt")] if out.endswith(".pt") else out
    torch.save(dict(model.state_dict()), base + ".plain.pt")
    torch.save(model.state_dict(), base + ".ordered.pt")
    print(f"torch {torch.__version__}: {len(sd)} tensors loaded with weights_only=True")


if __name__ == "__main__":
    main()
