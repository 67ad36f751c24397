#!/usr/bin/env python3
"""Weight bytes one decode token reads from a GGUF (batch 1): every matrix once, except the token embedding
(one row) and the routed experts (`*_exps`: expert_used_count of expert_count per layer). The decode
roofline's numerator for `k3 bench offline` / llama-bench on a quantised GGUF (k3's own GB/step column
assumes the checkpoint's stored formats, not the GGUF's). Usage: gguf_token_bytes.py FILE.gguf [--by-type]"""
import struct
import sys

# ggml type -> (block elements, block bytes)
TYPES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 20: (32, 18), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
         14: (256, 210), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 21: (256, 110),
         22: (256, 82), 23: (256, 136), 29: (256, 56), 30: (1, 2), 39: (32, 17)}
NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 20: "iq4_nl", 10: "q2_K", 11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K", 16: "iq2_xxs",
         17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s", 21: "iq3_s", 22: "iq2_s", 23: "iq4_xs", 29: "iq1_m", 30: "bf16",
         39: "mxfp4"}
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def main():
    f = open(sys.argv[1], "rb")
    rd = lambda fmt: struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
    string = lambda: f.read(rd("<Q")).decode("utf-8", "replace")

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = rd("<I"), rd("<Q")
            return [value(et) for _ in range(n)]
        return rd(SCALAR[t])

    assert f.read(4) == b"GGUF", "not a GGUF"
    rd("<I")
    n_tensors, n_kv = rd("<Q"), rd("<Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(rd("<I"))
    used = next(v for k, v in meta.items() if k.endswith(".expert_used_count"))
    count = next(v for k, v in meta.items() if k.endswith(".expert_count"))
    total = per_token = 0
    by_type = {}
    for _ in range(n_tensors):
        name = string()
        dims = [rd("<Q") for _ in range(rd("<I"))]
        t = rd("<I")
        rd("<Q")
        elems, bb = TYPES[t]
        row = dims[0] // elems * bb
        rows = 1
        for d in dims[1:]:
            rows *= d
        nbytes = row * rows
        if name == "token_embd.weight":
            read = row
        elif "_exps" in name:
            read = nbytes * used / count
        else:
            read = nbytes
        total += nbytes
        per_token += read
        by_type[NAMES[t]] = by_type.get(NAMES[t], 0) + read
    print(f"{per_token:.0f} bytes per decode token ({per_token / 1e9:.4f} GB; file tensors {total / 1e9:.3f} GB; "
          f"experts {used} of {count})")
    if "--by-type" in sys.argv:
        for k, v in sorted(by_type.items(), key=lambda kv: -kv[1]):
            print(f"  {k}: {v / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
