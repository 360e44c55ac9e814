#!/usr/bin/env python3
"""Cuts OpenCV's handwritten digits (digits.png in Debian's opencv-doc: 5000 grayscale 20x20
digits, 500 per class, in 50 rows of 100) into an ImageNet-layout JPEG folder tree:
OUT/train/<digit>/*.JPEG (400 per class) and OUT/val/<digit>/*.JPEG (100 per class, every fifth
digit of each class). Grayscale baseline JPEGs, quality 95, at their own 20x20 size (the
recipes upscale them, as the convergence benchmark's 32 px do).

Usage: make_digits.py OUT [--src digits.png] [--scale N]  (--scale: Lanczos-upscale each digit
N times first, for pipelines that want bigger images; default 1)."""
import argparse
import os
import sys

from PIL import Image

DEFAULT_SRC = "/usr/share/doc/opencv-doc/examples/data/digits.png"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--src", default=DEFAULT_SRC)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--quality", type=int, default=95)
    a = ap.parse_args()
    if not os.path.exists(a.src):
        sys.exit(f"make_digits.py: {a.src} not found (apt-get install opencv-doc, or give --src)")
    img = Image.open(a.src).convert("L")
    if img.size != (2000, 1000):
        sys.exit(f"make_digits.py: {a.src} is {img.size[0]}x{img.size[1]}, expected OpenCV's 2000x1000 digits.png")
    count = {"train": 0, "val": 0}
    for digit in range(10):
        k = 0
        for row in range(digit * 5, digit * 5 + 5):
            for col in range(100):
                cell = img.crop((col * 20, row * 20, col * 20 + 20, row * 20 + 20))
                if a.scale > 1:
                    cell = cell.resize((20 * a.scale, 20 * a.scale), Image.LANCZOS)
                split = "val" if k % 5 == 4 else "train"
                d = os.path.join(a.out, split, str(digit))
                os.makedirs(d, exist_ok=True)
                cell.save(os.path.join(d, f"{digit}_{k:03d}.JPEG"), quality=a.quality)
                count[split] += 1
                k += 1
    print(f"make_digits.py: {count['train']} train and {count['val']} val images in {a.out}")


if __name__ == "__main__":
    main()
