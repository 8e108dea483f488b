#!/usr/bin/env python3
"""Rewrite a GGUF: every tensor of ggml type FROM becomes type TO, its blocks random (random bytes,
then an f16 scale of 0.0005-0.004 at each block's start: valid blocks of the grid i-quants).
For measuring the types the reference's quantizer refuses to write without an importance matrix
(iq3_xxs, iq2_*), e.g. an IQ3_M file's iq3_s experts (21) as iq3_xxs (18):
    bench/retype_gguf.py qwen3moe-1-iq3_m.gguf qwen3moe-1-iq3_xxs.gguf 21 18
Types it knows: iq3_s 21, iq3_xxs 18, iq2_xxs 16, iq2_xs 17, iq2_s 22, iq1_s 19, iq1_m 29 (whose d is the
top nibbles of its four scale words). Plain Python 3."""
import struct, sys, random

BLOCK = {21: (256, 110), 18: (256, 98), 16: (256, 66), 17: (256, 74), 22: (256, 82), 19: (256, 50), 29: (256, 56)}
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

def main():
    src, dst, t_from, t_to = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    data = open(src, 'rb').read()
    pos = 0
    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos); pos += struct.calcsize(fmt); return v
    def skip_value(t):
        nonlocal pos
        if t in SCALAR: pos += SCALAR[t]
        elif t == 8: n, = take('<Q'); pos += n
        elif t == 9:
            et, n = take('<IQ')
            for _ in range(n): skip_value(et)
        else: raise SystemExit('unknown kv type %d' % t)
    magic, version, n_t, n_kv = take('<IIQQ')
    alignment = 32
    for _ in range(n_kv):
        n, = take('<Q'); key = data[pos:pos + n]; pos += n
        t, = take('<I')
        if key == b'general.alignment': alignment, = struct.unpack_from('<I', data, pos)
        skip_value(t)
    kv_end = pos
    infos = []
    for _ in range(n_t):
        start = pos
        n, = take('<Q'); name = data[pos:pos + n]; pos += n
        nd, = take('<I'); dims = take('<%dQ' % nd); t, off = take('<IQ')
        infos.append([name, dims, t, off])
    base = (pos + alignment - 1) // alignment * alignment
    rng = random.Random(1)
    out_infos, blobs, at = [], [], 0
    offs = sorted(i[3] for i in infos) + [len(data) - base]
    for name, dims, t, off in infos:
        nxt = min(o for o in offs if o > off)
        if t == t_from:
            be, bb = BLOCK[t_to]
            n = 1
            for d in dims: n *= d
            nb = n // be
            blob = bytearray(rng.randbytes(nb * bb))
            for b in range(nb):  # d: a moderate positive f16 (0.0005..0.004)
                d = struct.unpack('<H', struct.pack('<e', rng.uniform(0.0005, 0.004)))[0]
                if t_to != 29:
                    struct.pack_into('<H', blob, b * bb, d)
                    continue
                for q in range(4):  # iq1_m: nibble q of d tops scale word q (bytes 48..55)
                    i = b * bb + 48 + 2 * q + 1
                    blob[i] = (blob[i] & 0xF) | ((d >> (4 * q)) & 0xF) << 4
            t = t_to
        else:
            blob = data[base + off:base + nxt]
            be, bb = BLOCK.get(t, (1, 0))
        at = (at + alignment - 1) // alignment * alignment
        out_infos.append((name, dims, t, at))
        blobs.append((at, bytes(blob)))
        at += len(blob)
    head = bytearray(data[:kv_end])
    for name, dims, t, off in out_infos:
        head += struct.pack('<Q', len(name)) + name + struct.pack('<I', len(dims))
        head += struct.pack('<%dQ' % len(dims), *dims) + struct.pack('<IQ', t, off)
    head += b'\0' * ((-len(head)) % alignment)
    with open(dst, 'wb') as f:
        f.write(head)
        cur = 0
        for off, blob in blobs:
            f.write(b'\0' * (off - cur)); f.write(blob); cur = off + len(blob)

main()
