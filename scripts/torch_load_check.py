#!/usr/bin/env python3
"""Loads a state dict aiacc wrote (--save-weights X.pt) the way PyTorch users do, for the C++ test.

Usage: torch_load_check.py WEIGHTS.pt ARCH NUM_CLASSES OUT.pt
torch.load(WEIGHTS, weights_only=True) must give a dict; torchvision's ARCH(num_classes=NUM_CLASSES)
must take it with load_state_dict(strict=True) and list the same keys in the same order. Then one
fixed input (seeded) goes through the model in eval mode, and OUT.pt gets
torch.save({"input": x, "output": y}) as a plain dict, for the test to compare with aiacc's output;
Then the files users hand to --init-weights, each holding the model's state dict: OUT.plain.pt (a
dict), OUT.ordered.pt (the OrderedDict model.state_dict() is), OUT.nested.pt (a training checkpoint:
epoch, DDP's "module." names under "state_dict", the optimizer's state, an argparse.Namespace),
OUT.p4.pt (pickle protocol 4, under "model" as torchvision's reference scripts save) and
OUT.legacy.pt (the pre-1.6 non-zip format).
Exits 3 when torch or torchvision is missing (the C++ test skips with the message).
"""
import argparse
import collections
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
    base = out[: -len(".pt")] if out.endswith(".pt") else out
    sd = model.state_dict()
    torch.save(dict(sd), base + ".plain.pt")
    torch.save(sd, base + ".ordered.pt")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    ddp = collections.OrderedDict(("module." + k, v) for k, v in sd.items())
    torch.save({"epoch": 3, "state_dict": ddp, "optimizer": optimizer.state_dict(),
                "args": argparse.Namespace(lr=0.1, arch=arch), "best_acc1": torch.tensor(55.5)},
               base + ".nested.pt")
    torch.save({"model": sd, "epoch": 7}, base + ".p4.pt", pickle_protocol=4)
    torch.save(sd, base + ".legacy.pt", _use_new_zipfile_serialization=False)
    print(f"torch {torch.__version__}: {len(sd)} tensors loaded with weights_only=True")


if __name__ == "__main__":
    main()
