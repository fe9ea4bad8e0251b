#!/usr/bin/env python3
"""Checks that every SVG named on the command line draws nothing outside its canvas.

Each SVG is rendered with its canvas widened by 200 px on every side (its root's width,
height and viewBox; nothing else changes) by librsvg's rsvg-convert (Debian's
librsvg2-bin, which scripts/deps.sh installs; text in DejaVu Sans, fonts-dejavu-core),
at half size; any pixel drawn outside the original canvas (text that runs past an edge,
above all) makes the check fail, naming the SVG and the box of those pixels. The PNG is
decoded here with the standard library (zlib). Exit status 0 when all fit, 1 otherwise.
Usage: svg_fit.py FILE.svg...
"""
import os
import re
import subprocess
import struct
import sys
import zlib


def png_rgba(path):
    """(width, height, rows of RGBA bytes) of an 8-bit RGBA, non-interlaced PNG."""
    d = open(path, "rb").read()
    assert d[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(d):
        n, typ = struct.unpack(">I4s", d[pos:pos + 8])
        body = d[pos + 8:pos + 8 + n]
        pos += 12 + n
        if typ == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (depth, ctype, interlace) == (8, 6, 0), (path, depth, ctype, interlace)
        elif typ == b"IDAT":
            idat += body
    raw, bpp, stride = zlib.decompress(idat), 4, w * 4
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, rows


def outside(svg_path, margin=200, zoom=0.5):
    """The box [x0, y0, x1, y1] (the SVG's px) of what svg_path draws outside its canvas, or None."""
    s = open(svg_path, encoding="utf-8").read()
    m = re.search(r'width="(\d+)" height="(\d+)" viewBox="0 0 (\d+) (\d+)"', s)
    assert m and m.group(1) == m.group(3) and m.group(2) == m.group(4), f"{svg_path}: no canvas size"
    W, H = int(m.group(1)), int(m.group(2))
    wide = (f'width="{W + 2 * margin}" height="{H + 2 * margin}" '
            f'viewBox="{-margin} {-margin} {W + 2 * margin} {H + 2 * margin}"')
    wide_path, png = svg_path + ".wide.svg", svg_path + ".wide.png"
    open(wide_path, "w", encoding="utf-8").write(s.replace(m.group(0), wide, 1))
    subprocess.run(["rsvg-convert", "-z", str(zoom), "-o", png, wide_path], check=True)
    w, _, rows = png_rgba(png)
    os.remove(wide_path)
    os.remove(png)
    x0, y0, x1, y1 = margin * zoom, margin * zoom, (margin + W) * zoom, (margin + H) * zoom
    box = None
    for y, row in enumerate(rows):
        inside_y = y0 <= y < y1
        for x in range(w):
            if row[4 * x + 3] and not (inside_y and x0 <= x < x1):
                px, py = x / zoom - margin, y / zoom - margin
                box = [px, py, px, py] if box is None else [min(box[0], px), min(box[1], py),
                                                            max(box[2], px), max(box[3], py)]
    return box


def main(paths):
    bad = 0
    for p in paths:
        b = outside(p)
        if b is None:
            print(f"{os.path.basename(p)}: fits its canvas")
        else:
            bad += 1
            print(f"{os.path.basename(p)}: drawn outside its canvas at x {b[0]:.0f}..{b[2]:.0f}, "
                  f"y {b[1]:.0f}..{b[3]:.0f}")
    return 1 if bad or not paths else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
