#!/usr/bin/env python3
"""Renders an aiacc --timeline file as a PNG: one row per stream (row 0: compute, green; rows
1..K: communication channels, red), time left to right, like the classic overlap picture.

Usage: timeline_png.py TIMELINE.json OUT.png [FIRST_MS LAST_MS]
Needs only python3-pil (Debian).
"""
import json
import sys

from PIL import Image, ImageDraw


def main():
    events = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    spans = [e for e in events if e.get("ph") == "X"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    if not spans:
        raise SystemExit("no spans in " + sys.argv[1])
    t0 = min(e["ts"] for e in spans) if len(sys.argv) < 5 else float(sys.argv[3]) * 1000
    t1 = max(e["ts"] + e["dur"] for e in spans) if len(sys.argv) < 5 else float(sys.argv[4]) * 1000
    rows = sorted({e["tid"] for e in spans} | set(names))
    width, row_h, left = 1600, 36, 110
    img = Image.new("RGB", (width, row_h * len(rows) + 30), "white")
    draw = ImageDraw.Draw(img)
    scale = (width - left - 10) / max(1.0, t1 - t0)
    for i, tid in enumerate(rows):
        y = 10 + i * row_h
        draw.text((5, y + 10), names.get(tid, f"row {tid}"), fill="black")
        for e in spans:
            if e["tid"] != tid or e["ts"] + e["dur"] < t0 or e["ts"] > t1:
                continue
            x0 = left + (max(e["ts"], t0) - t0) * scale
            x1 = left + (min(e["ts"] + e["dur"], t1) - t0) * scale
            color = (40, 160, 60) if tid == 0 else (200, 40, 40)
            if e["name"].startswith("gradient sync wait"):
                color = (230, 200, 60)  # exposed communication, seen from compute
            draw.rectangle([x0, y, max(x0 + 1, x1), y + row_h - 8], fill=color)
    draw.text((left, row_h * len(rows) + 12), f"{(t1 - t0) / 1000:.1f} ms; green compute, yellow "
              "waiting for communication, red communication per channel", fill="black")
    img.save(out)


if __name__ == "__main__":
    main()
