#!/usr/bin/env python3
"""torchvision's side of the data-pipeline statistics test (tests/transforms_stats_test.cc).

Usage: golden_transforms.py OUT_DIR SIZE MIN_SCALE SAMPLES
Writes test images as JPEG files, OUT_DIR/images/{train,val}/a/<name>.JPEG (the same files in
both), and OUT_DIR/golden.bin (aiacc's named-tensor format, models/weights.h) with:
  "boxes.<W>x<H>"   [N, 4] int64 (x, y, w, h): RandomResizedCrop.get_params(scale=(MIN_SCALE, 1))
                    on a W x H image, N = 20000, for every size in SIZES;
  "mean.<name>"     [SAMPLES, 3]: per-channel mean of each output of the train transform
                    (RandomResizedCrop(SIZE, scale=(MIN_SCALE, 1)), RandomHorizontalFlip,
                    ToTensor, Normalize) applied SAMPLES times to the image;
  "var.<name>"      [SAMPLES, 3]: the same outputs' per-channel variance (over pixels);
  "fixed.<name>"    [20, 3, SIZE, SIZE]: the crop boxes "fixedbox.<name>" [20, 4] (x, y, w, h; from
                    get_params) resized to SIZE x SIZE without flip (torchvision's resized_crop);
  "val.<name>"      [3, SIZE, SIZE]: the val transform's output (Resize(round(SIZE / 0.875)),
                    CenterCrop(SIZE), ToTensor, Normalize).
The images: 'digit', a 20x20 grayscale stroke (as OpenCV's digits); 'small', 48x40 RGB shapes;
'photo', a 400x300 RGB picture with gradients, shapes and texture (decoded at a reduced DCT scale
by aiacc). Runs with Debian's python3-torch/python3-torchvision; exits 3 when absent."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
    import torchvision.transforms as T
    from PIL import Image, ImageDraw, ImageFilter
except ImportError as e:  # the C++ test skips with this message
    print(f"python3-torchvision unavailable: {e}", file=sys.stderr)
    sys.exit(3)
from golden_resnet import write_named

SIZES = [(20, 20), (48, 40), (400, 300), (300, 400), (1000, 10)]
NORM = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


def images():
    g = torch.Generator().manual_seed(3)
    digit = Image.new("L", (20, 20), 0)
    d = ImageDraw.Draw(digit)
    d.ellipse((5, 3, 15, 17), outline=255, width=3)
    d.line((12, 4, 6, 16), fill=200, width=2)
    digit = digit.filter(ImageFilter.GaussianBlur(0.8))
    small = Image.new("RGB", (48, 40), (30, 60, 200))
    d = ImageDraw.Draw(small)
    d.rectangle((4, 6, 26, 30), fill=(240, 200, 20))
    d.ellipse((20, 10, 44, 36), fill=(200, 30, 60))
    yy, xx = torch.meshgrid(torch.arange(300.0), torch.arange(400.0), indexing="ij")
    noise = torch.rand(300, 400, 3, generator=g) * 40
    rgb = torch.stack([xx / 400 * 200, yy / 300 * 180, 255 - (xx + yy) / 700 * 200], -1) + noise
    photo = Image.fromarray(rgb.clamp(0, 255).to(torch.uint8).numpy(), "RGB")
    d = ImageDraw.Draw(photo)
    d.ellipse((60, 40, 220, 200), fill=(250, 240, 30))
    d.rectangle((230, 120, 380, 280), fill=(20, 120, 40))
    for k in range(0, 400, 16):
        d.line((k, 0, k + 60, 300), fill=(255, 255, 255), width=2)
    return {"digit": digit, "small": small, "photo": photo}


def main():
    out, size, min_scale, samples = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    torch.manual_seed(11)
    items = []
    rrc = T.RandomResizedCrop(size, scale=(min_scale, 1.0))
    for w, h in SIZES:
        dummy = Image.new("L", (w, h))
        boxes = []
        for _ in range(20000):
            i, j, bh, bw = rrc.get_params(dummy, rrc.scale, rrc.ratio)
            boxes.append((j, i, bw, bh))
        items.append((f"boxes.{w}x{h}", torch.tensor(boxes, dtype=torch.int64)))
    train_tf = T.Compose([rrc, T.RandomHorizontalFlip(), T.ToTensor(), NORM])
    val_tf = T.Compose([T.Resize(int(round(size / 0.875))), T.CenterCrop(size), T.ToTensor(), NORM])
    for name, img in images().items():
        for split in ("train", "val"):
            d = os.path.join(out, "images", split, "a")
            os.makedirs(d, exist_ok=True)
            img.save(os.path.join(d, name + ".JPEG"), quality=95)
        # What the pipelines read: the decoded JPEG, as ImageFolder loads it (RGB).
        decoded = Image.open(os.path.join(out, "images", "train", "a", name + ".JPEG")).convert("RGB")
        outs = torch.stack([train_tf(decoded) for _ in range(samples)])
        items.append((f"mean.{name}", outs.mean((2, 3))))
        items.append((f"var.{name}", outs.var((2, 3), unbiased=False)))
        items.append((f"val.{name}", val_tf(decoded)))
        boxes, fixed = [], []
        for _ in range(20):
            i, j, bh, bw = rrc.get_params(decoded, rrc.scale, rrc.ratio)
            boxes.append((j, i, bw, bh))
            fixed.append(NORM(T.functional.to_tensor(T.functional.resized_crop(decoded, i, j, bh, bw, [size, size]))))
        items.append((f"fixedbox.{name}", torch.tensor(boxes, dtype=torch.int64)))
        items.append((f"fixed.{name}", torch.stack(fixed)))
    write_named(os.path.join(out, "golden.bin"), items)


if __name__ == "__main__":
    main()
