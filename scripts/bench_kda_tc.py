#!/usr/bin/env python3
"""KDA prefill in ONE process on one GPU: k3's tensor-core chunked kernel (kda_chunked_tc), k3's fp32 chunked
kernel (kda_chunked) and flash-linear-attention's chunk_kda, on the same inputs (random, q/k L2-normalised with
q scaled by D^-1/2 as the model does, bounded gate lower_bound * sigmoid(z) with lower_bound -5, beta in (0.05,
0.95), non-zero initial states). Prints accuracy against k3's exact fp32 recurrence (max|x - ref| / max|ref|) and
median times (CUDA events). Needs libkdashim.so (scripts/kda_bench_shim.cu) and fla on PYTHONPATH (optional).
Usage: bench_kda_tc.py LIB [--quick]"""
import ctypes
import struct
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_event_timing import bench  # noqa: E402

LIB = ctypes.CDLL(sys.argv[1])
QUICK = "--quick" in sys.argv
PROFILE = "--profile" in sys.argv  # per-kernel times (torch.profiler / CUPTI) of a few variants at 1 x 8192
D = 128
try:
    from fla.ops.kda import chunk_kda
    import fla
    FLA = getattr(fla, "__version__", "?")
except Exception as e:  # noqa: BLE001
    chunk_kda, FLA = None, f"unavailable ({e})"

vp = ctypes.c_void_p
for name, res in [("k3_kda_old_ws", ctypes.c_size_t), ("k3_kda_tc_ws", ctypes.c_size_t)]:
    getattr(LIB, name).restype = res
LIB.k3_kda_old_ws.argtypes = [ctypes.c_int] * 5
LIB.k3_kda_tc_ws.argtypes = [ctypes.c_int] * 5
LIB.k3_kda_old.argtypes = [vp] + [ctypes.c_int] * 5 + [vp] * 7 + [ctypes.c_size_t]
LIB.k3_kda_recurrent.argtypes = [vp, ctypes.c_int, ctypes.c_int, ctypes.c_int] + [vp] * 6
LIB.k3_kda_tc.argtypes = ([vp] + [ctypes.c_int] * 6 + [vp] * 7 +
                          [ctypes.c_int] * 3 + [vp, ctypes.c_size_t])  # bv, nbuf, intra, ws, wsb
LIB.k3_kda_tc2.argtypes = ([vp] + [ctypes.c_int] * 6 + [vp] * 7 +
                           [ctypes.c_int] * 4 + [vp, ctypes.c_size_t])  # bv, nbuf, intra, state, ws, wsb
HAS3 = hasattr(LIB, "k3_kda_tc3")  # + overlap after state (KdaTcTuning::overlap: 1 off, 2 on)
if HAS3:
    LIB.k3_kda_tc3.argtypes = ([vp] + [ctypes.c_int] * 6 + [vp] * 7 +
                               [ctypes.c_int] * 5 + [vp, ctypes.c_size_t])  # bv, nbuf, intra, state, overlap, ws, wsb
HAS4 = hasattr(LIB, "k3_kda_tc4")  # + fused after overlap (KdaTcTuning::fused: 1 off, 2 / 3 ring buffers)
if HAS4:
    LIB.k3_kda_tc4.argtypes = ([vp] + [ctypes.c_int] * 6 + [vp] * 7 +
                               [ctypes.c_int] * 6 + [vp, ctypes.c_size_t])  # bv, nbuf, intra, state, overlap, fused


def ptr(t):
    return ctypes.c_void_p(t.data_ptr() if t is not None else 0)


def ck(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: cuda error {rc}")




def rel(x, ref):
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def make(ns, T, H, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    N = ns * T
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)
    q = torch.nn.functional.normalize(r(N, H, D), dim=-1) * D ** -0.5
    k = torch.nn.functional.normalize(r(N, H, D), dim=-1)
    v = r(N, H, D)
    gate = -5.0 * torch.sigmoid(1.5 * r(N, H, D) - 1.0)  # (-5, 0): the bounded gate's range
    beta = 0.05 + 0.9 * torch.rand(N, H, device="cuda", generator=g)
    h0 = 0.1 * r(ns, H, D, D)
    return q.contiguous(), k.contiguous(), v.contiguous(), gate.contiguous(), beta.contiguous(), h0


def seq_table(S, ns, T):
    size = LIB.k3_kda_seq_size()
    raw = b"".join(struct.pack("<QQQQii", S[i].data_ptr(), 0, 0, 0, i * T, T).ljust(size, b"\0") for i in range(ns))
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).cuda()


def profile(variants, shape):
    from torch.profiler import ProfilerActivity, profile as tprof
    for name, fn in variants:
        if not any(x in name for x in ("tc32 bv32 buf1 bf16", "tc32 bv64 buf1 bf16", "tc32 bv32 buf3 bf16",
                                       "tc32 bv128 buf1 bf16", "tc32 bv128 buf3 bf16", "state-v2 8w bf16",
                                       "state-v2 4w bf16", "safe_gate", "bf16-in intra4", "bf16-in intra5")):
            continue
        call = fn[0] if isinstance(fn, tuple) else fn
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with tprof(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        print(f"== profile {shape} {name} (5 calls) ==")
        for ev in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:8]:
            print(f"   {ev.device_time_total / 5 / 1000:8.3f} ms/call  x{ev.count // 5:<3d} {ev.key[:110]}")


def main():
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  fla {FLA}")
    shapes = [(1, 8192, 32), (8, 1024, 32), (1, 8192, 96), (8, 1024, 96)]
    if QUICK:
        shapes = shapes[:1]
    if PROFILE:
        shapes = [(1, 8192, 32), (1, 8192, 96)]
    if os.environ.get("KDA_BENCH_SHAPES"):  # e.g. 1x8192x96,8x1024x96 (sequences x tokens x heads)
        shapes = [tuple(int(v) for v in s.split("x")) for s in os.environ["KDA_BENCH_SHAPES"].split(",")]
    only = [x for x in os.environ.get("KDA_BENCH_ONLY", "").split(",") if x]  # row-name substrings to keep
    rows = []
    for ns, T, H in shapes:
        N = ns * T
        q, k, v, gate, beta, h0 = make(ns, T, H, 1234 + H + ns)
        qb, kb, vb, gb = (x.bfloat16() for x in (q, k, v, gate))
        S = h0.clone()
        seqs = seq_table(S, ns, T)
        o = torch.empty(N, H, D, device="cuda")
        res = {}

        # exact reference: k3's fp32 token-by-token recurrence
        S.copy_(h0)
        ck(LIB.k3_kda_recurrent(ptr(seqs), ns, H, D, ptr(q), ptr(k), ptr(v), ptr(gate), ptr(beta), ptr(o)), "rec")
        torch.cuda.synchronize()
        o_ref, S_ref = o.clone(), S.clone()

        def k3_old(chunk):
            wsb = LIB.k3_kda_old_ws(N, ns, H, D, chunk)
            ws = torch.empty(wsb, dtype=torch.uint8, device="cuda")
            return lambda: ck(LIB.k3_kda_old(ptr(seqs), ns, N, H, D, chunk, ptr(q), ptr(k), ptr(v), ptr(gate),
                                             ptr(beta), ptr(o), ptr(ws), wsb), "old")

        def k3_tc(chunk, bv, bf16_in, cs=None, nbuf=0, intra=0):
            wsb = LIB.k3_kda_tc_ws(N, ns, H, D, chunk)
            ws = torch.empty(wsb, dtype=torch.uint8, device="cuda")
            ins = (qb, kb, vb, gb) if bf16_in else (q, k, v, gate)
            return lambda: ck(LIB.k3_kda_tc(ptr(seqs), ns, N, H, D, chunk, int(bf16_in), *(ptr(x) for x in ins),
                                            ptr(beta), ptr(o), ptr(cs), bv, nbuf, intra, ptr(ws), wsb), "tc")

        def k3_tc2(bf16_in, state, cs=None, intra=2):  # chunk 32; state 2 = v2 at 8 warps, 3 = v2 at 4 warps
            wsb = LIB.k3_kda_tc_ws(N, ns, H, D, 32)
            ws = torch.empty(wsb, dtype=torch.uint8, device="cuda")
            ins = (qb, kb, vb, gb) if bf16_in else (q, k, v, gate)
            return lambda: ck(LIB.k3_kda_tc2(ptr(seqs), ns, N, H, D, 32, int(bf16_in), *(ptr(x) for x in ins),
                                             ptr(beta), ptr(o), ptr(cs), 0, 0, intra, state, ptr(ws), wsb), "tc2")

        def k3_tc3(state, intra, overlap):  # k3_tc2 with bf16 inputs plus KdaTcTuning::overlap
            wsb = LIB.k3_kda_tc_ws(N, ns, H, D, 32)
            ws = torch.empty(wsb, dtype=torch.uint8, device="cuda")
            return lambda: ck(LIB.k3_kda_tc3(ptr(seqs), ns, N, H, D, 32, 1, *(ptr(x) for x in (qb, kb, vb, gb)),
                                             ptr(beta), ptr(o), None, 0, 0, intra, state, overlap, ptr(ws), wsb),
                              "tc3")

        def k3_tc4(fused, cs=None):  # bf16 inputs, chunk 32; fused 1 = the default two-kernel path, 2..5 = fused
            wsb = LIB.k3_kda_tc_ws(N, ns, H, D, 32)
            ws = torch.empty(wsb, dtype=torch.uint8, device="cuda")
            return lambda: ck(LIB.k3_kda_tc4(ptr(seqs), ns, N, H, D, 32, 1, *(ptr(x) for x in (qb, kb, vb, gb)),
                                             ptr(beta), ptr(o), ptr(cs), 0, 0, 0, 0, 1, fused, ptr(ws), wsb), "tc4")

        variants = [(f"k3 fp32 chunked{c}", k3_old(c)) for c in (32, 64)]
        # intra: 1 = v1, 2 = v2, 3 = v2 built for 4 blocks per SM, 4 = v3 (persistent, prefetched loads; bf16 inputs,
        # fp32 inputs run v2), 5 = v3 with streaming stores (chunk 32 only; chunk 64 always runs v1)
        for bf in (True, False):
            for c in (32, 64):
                for iv in ((2, 3, 1, 4, 5) if c == 32 else (1,)):
                    for bv in (32, 64, 128):
                        for nb in (1, 2, 3):
                            if (nb > 1 or bv == 128) and not (c == 32 and iv == 2):
                                continue  # two buffers were slower everywhere (run kda-tc-2); new knobs at tc32 only
                            if iv in (3, 4, 5) and bv != 32:
                                continue  # the 4-blocks-per-SM intra build, v3: one A/B row each (bv32 buf1)
                            variants.append((f"k3 tc{c} bv{bv} buf{nb} {'bf16' if bf else 'fp32'}-in intra{iv}",
                                             k3_tc(c, bv, bf, None, nb, iv)))
        n_chunks = ns * ((T + 31) // 32)
        cs = torch.empty(n_chunks, H, D, D, device="cuda")
        variants.append(("k3 tc32 auto bf16-in intra2 +chunk states", k3_tc(32, 0, True, cs, 0, 2)))
        # state kernel v2 (kda_tc_state2.cu; KdaTcTuning::state 2 = 8 warps, 3 = 4 warps), chunk 32, intra v2
        for bf in (True, False):
            for st, nw in ((2, 8), (3, 4)):
                variants.append((f"k3 tc32 state-v2 {nw}w {'bf16' if bf else 'fp32'}-in intra2", k3_tc2(bf, st)))
        variants.append(("k3 tc32 state-v2 8w bf16-in intra2 +chunk states", k3_tc2(True, 2, cs)))
        # intra v3 (4: persistent, next item prefetched; 5: + streaming stores) with the state kernel v2
        for iv in (4, 5):
            variants.append((f"k3 tc32 state-v2 8w bf16-in intra{iv}", k3_tc2(True, 2, None, iv)))
            variants.append((f"k3 tc32 state-v2 4w bf16-in intra{iv}", k3_tc2(True, 3, None, iv)))
        # the state kernel overlapped with intra v3cs (KdaTcTuning::overlap 2: programmatic dependent launch, per
        # (chunk, head) ready flags; K3_KDA_TC_OVERLAP_INTRA_PER_SM sets the intra blocks per SM)
        if HAS3:
            variants.append(("k3 tc32 state-v2 4w bf16-in intra5 overlap", k3_tc3(3, 5, 2)))
            variants.append(("k3 tc32 state-v2 8w bf16-in intra5 overlap", k3_tc3(2, 5, 2)))
        # the fused kernel (kda_tc_fused.cu) beside the default two-kernel path (intra v3cs + the state rule)
        if HAS4:
            variants.append(("k3 tc32 default bf16-in (two kernels)", k3_tc4(1)))
            variants.append(("k3 tc32 fused nbuf2 bf16-in", k3_tc4(2)))
            variants.append(("k3 tc32 fused nbuf3 bf16-in", k3_tc4(3)))
            variants.append(("k3 tc32 fused ftz-exp bf16-in", k3_tc4(4)))
            variants.append(("k3 tc32 fused ftz-exp T-consumer bf16-in", k3_tc4(5)))
            variants.append(("k3 tc32 fused nbuf2 bf16-in +chunk states", k3_tc4(2, cs)))
            variants.append(("k3 tc32 default bf16-in (two kernels) +chunk states", k3_tc4(1, cs)))
        if chunk_kda is not None:
            cu = torch.arange(0, N + 1, T, device="cuda", dtype=torch.long)
            fq, fk, fv, fb = (x.unsqueeze(0) for x in (qb, kb, vb, beta.bfloat16()))
            fg32, fg16 = gate.unsqueeze(0), gb.unsqueeze(0)
            fo = {}

            def fla_fn(gg, safe):
                kw = dict(safe_gate=True, lower_bound=-5.0) if safe else {}

                def run():
                    fo["o"], fo["S"] = chunk_kda(fq, fk, fv, gg, fb, scale=1.0, initial_state=h0,
                                                 output_final_state=True, cu_seqlens=cu, **kw)
                return run, fo
            for name, gg, safe in [("fla chunk_kda bf16 (g fp32)", fg32, False), ("fla chunk_kda bf16 (g bf16)", fg16, False),
                                   ("fla chunk_kda bf16 safe_gate lb=-5", fg32, True)]:
                variants.append((name, fla_fn(gg, safe)))
        if only:
            variants = [(n, f) for n, f in variants if any(x in n for x in only)]
        if PROFILE:
            profile(variants, f"{ns} x {T} H={H}")
            continue
        for name, fn in variants:
            fla_run = isinstance(fn, tuple)
            call = fn[0] if fla_run else fn
            try:
                S.copy_(h0)
                call()
                torch.cuda.synchronize()
                if fla_run:
                    eo, es = rel(fn[1]["o"].reshape(N, H, D).float(), o_ref), rel(fn[1]["S"].float(), S_ref)
                else:
                    eo, es = rel(o, o_ref), rel(S, S_ref)
                ms = bench(call, 10 if QUICK else 20)
            except Exception as e:  # noqa: BLE001
                print(f"{ns} x {T} H={H} {name}: FAILED {str(e).splitlines()[0][:200]}")
                continue
            rows.append((f"{ns} x {T}", H, name, ms, eo, es))
            print(f"{ns:2d} x {T:5d}  H={H:3d}  {name:38s} {ms:8.3f} ms   out err {eo:.2e}  state err {es:.2e}",
                  flush=True)
        del q, k, v, gate, qb, kb, vb, gb, cs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
