#!/usr/bin/env python3
"""Reads a checkpoint of aiacc_checkpoint_tool (tests/checkpoint_tool.cc) the way PyTorch users do.

Usage: checkpoint_load_check.py CHECKPOINT
torch.load(CHECKPOINT, weights_only=True) must give a plain dict whose "model" torchvision's
resnet18(num_classes=5) takes with load_state_dict(strict=True), and every value must be the
tool's closed form: parameter i's element k is sin(1000 i + k) as float32, parameters in
torchvision's order; the optimizer's two groups and momentum buffers cos(1000 i + k) on every
second parameter; the training position, history, settings, class names and configuration.
Exits 3 when torch or torchvision is missing (the test is then skipped), 1 on any difference.
"""
import math
import sys

try:
    import torch
    import torchvision
except ImportError as e:
    print(f"torch/torchvision unavailable: {e}", file=sys.stderr)
    sys.exit(3)


def closed_form(i, like, fn):
    n = like.numel()
    return torch.tensor([fn(1000.0 * i + k) for k in range(n)], dtype=torch.float32).reshape(like.shape)


def check(cond, what):
    if not cond:
        raise SystemExit(f"checkpoint_load_check: {what}")


def main():
    ck = torch.load(sys.argv[1], weights_only=True)
    check(type(ck) is dict, f"torch.load gave {type(ck).__name__}, not a dict")
    check(ck["format"] == "aiacc checkpoint" and ck["format_version"] == 5, "format")
    model = torchvision.models.resnet18(num_classes=5)
    check(list(ck["model"].keys()) == list(model.state_dict().keys()), "model keys or their order")
    model.load_state_dict(ck["model"], strict=True)
    params = list(model.parameters())
    for i, p in enumerate(params):
        check(torch.equal(p.detach(), closed_form(i, p, math.sin)), f"parameter {i} differs")
    groups = ck["optimizer"]["groups"]
    check(len(groups) == 2, "two parameter groups")
    check([float(g["lr"]) for g in groups] == [0.25, 0.125], "learning rates")
    check([float(g["momentum"]) for g in groups] == [0.9, 0.8], "momentum")
    check([bool(g["nesterov"]) for g in groups] == [True, False], "nesterov")
    buffers = groups[0]["momentum_buffers"] + groups[1]["momentum_buffers"]
    check(len(buffers) == len(params), "one momentum entry per parameter")
    # The tool's groups: parameters of 2 or more dims first, then the rest, each in model order.
    order = [p for p in params if p.dim() > 1] + [p for p in params if p.dim() <= 1]
    for j, (b, p) in enumerate(zip(buffers, order)):
        if j % 2:
            check(b is None, f"momentum buffer {j} should be None")
        else:
            check(torch.equal(b, closed_form(j, p, math.cos)), f"momentum buffer {j} differs")
    st = ck["training_state"]
    check((st["epochs_done"], st["step"], st["images_seen"], st["batches_in_epoch"]) == (3, 123, 4567, 9), "position")
    check(float(st["elapsed_s"]) == 89.5 and float(st["loss_scale"]) == 16384.0, "times and scale")
    check(st["evals"].shape == (2, 7) and float(st["evals"][1, 0]) == 120, "evaluation history")
    check(st["settings"] == {"--seed": "5", "dataset": "4 classes (names 1a2b), 10 train and 2 val files"}, "settings")
    check(torch.equal(st["rng_cpu"], torch.arange(64, dtype=torch.uint8)), "rng state")
    check((float(st["transfer_scale"]), st["transfer_scale_good_steps"]) == (2048.0, 5), "transfer scale")
    tuned = st["comm_tuned"]
    check((float(tuned["bucket_mb"]), tuned["channels"], tuned["two_level"]) == (8.0, 2, True), "tuner's choice")
    check(st["channel_weights"].tolist() == [0.625, 0.375], "channel shares")
    check(st["bucket_order"].tolist() == [3, 1, 0, 2], "bucket order")
    check(torch.equal(st["rng_cuda"], torch.arange(16, dtype=torch.uint8) * 3), "CUDA generator state")
    check(ck["classes"] == ["n01440764", "n01443537", "caf\u00e9", "d", "e"], "class names")
    check(ck["config"] == {"arch": "resnet18", "lr": "0.25", "data": "/data/imagenet"}, "configuration")
    print(f"torch {torch.__version__}: the checkpoint loads with weights_only=True and every value is as written")


if __name__ == "__main__":
    main()
