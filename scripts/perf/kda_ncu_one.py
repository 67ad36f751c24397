#!/usr/bin/env python3
"""One KDA tensor-core prefill at a given shape (for ncu): k3's kda_chunked_tc through libkdashim.so, the bench's
inputs (scripts/bench_kda_tc.py). Usage: kda_ncu_one.py LIB [ns T H chunk bv intra calls]"""
import ctypes
import struct
import sys

import torch

LIB = ctypes.CDLL(sys.argv[1])
ns, T, H, chunk, bv, intra, calls = (int(x) for x in (sys.argv[2:] + ["1", "8192", "96", "32", "0", "0", "2"][len(sys.argv) - 2:]))
D = 128
vp = ctypes.c_void_p
LIB.k3_kda_tc_ws.restype = ctypes.c_size_t
LIB.k3_kda_tc_ws.argtypes = [ctypes.c_int] * 5
LIB.k3_kda_tc.argtypes = [vp] + [ctypes.c_int] * 6 + [vp] * 7 + [ctypes.c_int] * 3 + [vp, ctypes.c_size_t]
p = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else 0)
g = torch.Generator(device="cuda").manual_seed(1234)
N = ns * T
r = lambda *s: torch.randn(*s, device="cuda", generator=g)
q = (torch.nn.functional.normalize(r(N, H, D), dim=-1) * D ** -0.5).bfloat16()
k = torch.nn.functional.normalize(r(N, H, D), dim=-1).bfloat16()
v = r(N, H, D).bfloat16()
gate = (-5.0 * torch.sigmoid(1.5 * r(N, H, D) - 1.0)).bfloat16()
beta = 0.05 + 0.9 * torch.rand(N, H, device="cuda", generator=g)
S = 0.1 * r(ns, H, D, D)
size = LIB.k3_kda_seq_size()
raw = b"".join(struct.pack("<QQQQii", S[i].data_ptr(), 0, 0, 0, i * T, T).ljust(size, b"\0") for i in range(ns))
seqs = torch.frombuffer(bytearray(raw), dtype=torch.uint8).cuda()
o = torch.empty(N, H, D, device="cuda")
wsb = LIB.k3_kda_tc_ws(N, ns, H, D, chunk)
ws = torch.empty(wsb, dtype=torch.uint8, device="cuda")
for _ in range(calls):
    rc = LIB.k3_kda_tc(p(seqs), ns, N, H, D, chunk, 1, p(q), p(k), p(v), p(gate), p(beta), p(o), p(None), bv, 0,
                       intra, p(ws), wsb)
    assert rc == 0, rc
torch.cuda.synchronize()
print("ok", float(o.abs().mean()))
