#!/usr/bin/env python3
"""Converts the 32-bit BMP that the samples' screenshots are (`kiln-game --screenshot`, kiln-chat's
`screenshot` script action; SDL2 saves only BMP) into an RGB PNG, with the standard library only.
usage: bmp_to_png.py IN.bmp OUT.png"""
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
off = struct.unpack_from('<I', data, 10)[0]
w, h = struct.unpack_from('<ii', data, 18)
bpp = struct.unpack_from('<H', data, 28)[0]
assert bpp == 32
rows = []
stride = w * 4
for y in range(abs(h)):
    src = y if h < 0 else abs(h) - 1 - y
    row = data[off + src * stride: off + (src + 1) * stride]
    out = bytearray(b'\x00')
    for x in range(w):
        b, g, r = row[4*x], row[4*x+1], row[4*x+2]
        out += bytes((r, g, b))
    rows.append(bytes(out))
raw = b''.join(rows)
def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
png = b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, abs(h), 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw, 9)) + chunk(b'IEND', b'')
open(sys.argv[2], 'wb').write(png)
