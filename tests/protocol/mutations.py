"""Byte mutations for fuzzing frames: flips, cuts, insertions, and edge values over length fields and varints."""

from __future__ import annotations

import random

INT16_EDGES = [0, 1, -1, -2, 0x7FFF, -0x8000, 0x7FFE]
INT32_EDGES = [0, 1, -1, -2, 0x7FFFFFFF, -0x80000000, 0x7FFFFFFE, 0x00010000]
VARINT_EDGES = [
    b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xff\x7f",
    b"\x80\x00",                          # non-minimal
    b"\xff\xff\xff\xff\x0f",              # 2**32 - 1
    b"\x80\x80\x80\x80\x10",              # 2**32: does not fit 32 bits
    b"\xff\xff\xff\xff\x7f",              # 2**35 - 1
    b"\xff\xff\xff\xff\xff\x01",          # six bytes
    b"\xff\xff\xff\xff",                  # unterminated
]


def mutate(rng: random.Random, frame: bytes, rounds: int) -> bytes:
    data = bytearray(frame)
    for _ in range(rounds):
        op = rng.randrange(9)
        i = rng.randrange(len(data) + 1)
        if op == 0 and data:                          # flip a bit
            i = min(i, len(data) - 1)
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1 and data:                        # random byte
            i = min(i, len(data) - 1)
            data[i] = rng.randrange(256)
        elif op == 2:                                 # truncate
            del data[i:]
        elif op == 3:                                 # insert random bytes
            data[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 4:                                 # delete a few bytes
            del data[i:i + rng.randint(1, 8)]
        elif op == 5:                                 # int16 length/count field
            data[i:i + 2] = rng.choice(INT16_EDGES).to_bytes(2, "big", signed=True)
        elif op == 6:                                 # int32 length/count field
            data[i:i + 4] = rng.choice(INT32_EDGES).to_bytes(4, "big", signed=True)
        elif op == 7:                                 # varint replacing one byte
            data[i:i + 1] = rng.choice(VARINT_EDGES)
        else:                                         # duplicate a slice elsewhere
            j = rng.randrange(len(data) + 1)
            data[j:j] = data[i:i + rng.randint(1, 16)]
    return bytes(data)
