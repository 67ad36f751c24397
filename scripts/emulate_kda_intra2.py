#!/usr/bin/env python3
"""CPU-only check of kda_tc_intra2_kernel's index math (src/k3/backend/cuda/kda_chunked_tc.cu): emulates every
lane of every warp in float64 (the load / scan lane roles, the shuffles, ldmatrix and mma.m16n8k16 fragment
semantics as PTX defines them, the shared-memory layout, the blocked inverse) and compares the workspace
outputs (Q exp(G), exp(G_last - G) k, A_qk, W, U, exp(G_last)) with the direct chunk math. No bf16 rounding:
a correct mapping agrees to ~1e-15, an indexing slip by O(1); unwritten shared memory is NaN, so reading it
shows. Keep it in step with the kernel when either changes. Usage: emulate_kda_intra2.py"""
import numpy as np
rng = np.random.default_rng(0)
L, D = 32, 128
LDB, LDK, LDX, LDT = D + 8, L + 4, 17, L + 8

def run(Lc):
    g = np.zeros((L, D)); q = np.zeros((L, D)); k = np.zeros((L, D)); v = np.zeros((L, D)); beta = np.zeros(L)
    g[:Lc] = -5 * rng.random((Lc, D)); q[:Lc] = rng.standard_normal((Lc, D)) * 0.1
    k[:Lc] = rng.standard_normal((Lc, D)) / np.sqrt(D); v[:Lc] = rng.standard_normal((Lc, D)); beta[:Lc] = 0.05 + 0.9 * rng.random(Lc)
    # --- reference
    G = np.cumsum(g, 0); Gl = G[Lc - 1]
    Akk = np.tril((k * np.exp(G)) @ (k * np.exp(-G)).T, -1) * beta[:, None]
    Aqk = np.tril((q * np.exp(G)) @ (k * np.exp(-G)).T, 0)
    T = np.linalg.inv(np.eye(L) + Akk) * beta[None, :]
    Wr = T @ (k * np.exp(G)); Ur = T @ v; Qr = q * np.exp(G); Kr_ = k * np.exp(Gl - G)
    # --- emulation
    sm = {n: np.full((rows, ld), np.nan) for n, rows, ld in [("KE", L, LDB), ("V", L, LDB), ("Ql", L, LDB), ("Kl", L, LDB), ("Kr", 48, LDB), ("Ak", L, LDK), ("Mi", L, LDK), ("Xs", 16, LDX), ("Ts", L, LDT)]}
    bs = np.array([beta[t] if t < Lc else 0 for t in range(L)])
    gQ = np.full((L, D), np.nan); gK = np.full((L, D), np.nan); gA = np.full((L, L), np.nan); gW = np.full((L, D), np.nan); gU = np.full((L, D), np.nan); eL = np.full(D, np.nan)
    for w in range(8):
        tiles = []
        for lane in range(32):
            seg, cg = lane >> 2, lane & 3; r0, d = 4 * seg, 16 * w + 4 * cg
            t = {}
            t["G"] = np.array([[g[r0 + u, d + c] if r0 + u < Lc else 0 for c in range(4)] for u in range(4)], dtype=float)
            for n, x in (("q", q), ("k", k), ("v", v)):
                t[n] = np.array([[x[r0 + u, d + c] if r0 + u < Lc else 0 for c in range(4)] for u in range(4)], dtype=float)
            for u in range(1, 4): t["G"][u] += t["G"][u - 1]
            tiles.append(t)
        incl = np.array([t["G"][3].copy() for t in tiles])
        off = 4
        while off < 32:
            y = incl.copy(); new = incl.copy()
            for lane in range(32):
                if lane >= off: new[lane] += y[lane - off]
            incl = new; off *= 2
        for lane in range(32):
            ex = incl[lane - 4] if lane >= 4 else 0
            tiles[lane]["G"] += ex
        for lane in range(32):
            seg, cg = lane >> 2, lane & 3; r0, d = 4 * seg, 16 * w + 4 * cg; t = tiles[lane]
            g0 = tiles[cg]["G"][0]; g16 = tiles[16 + cg]["G"][0]; gl = tiles[28 + cg]["G"][3]
            first = r0 < 16
            for u in range(4):
                sm["V"][r0 + u, d:d + 4] = t["v"][u]
            for u in range(4):
                i = r0 + u; Gu = t["G"][u]
                eG = np.exp(Gu); eD = np.exp(gl - Gu); eA = np.exp(Gu - (g0 if first else g16)); e16 = np.exp(np.minimum(g16 - Gu, 88))
                sm["KE"][i, d:d + 4] = t["k"][u] * eG; sm["Ql"][i, d:d + 4] = t["q"][u] * eA; sm["Kl"][i, d:d + 4] = t["k"][u] * eA
                sm["Kr"][16 + i, d:d + 4] = t["k"][u] * e16
                if first: sm["Kr"][i, d:d + 4] = t["k"][u] * np.exp(g0 - Gu)
                if i < Lc: gQ[i, d:d + 4] = t["q"][u] * eG; gK[i, d:d + 4] = t["k"][u] * eD
            if seg == 7: eL[d:d + 4] = np.exp(gl)
    def ldsm(buf, row0, addr, trans=False):  # addr(lane) -> (row, col) of the 8-element row segment
        out = np.zeros((32, 4, 2))
        for m in range(4):
            mat = np.array([sm[buf][row0 + addr(8 * m + r)[0], addr(8 * m + r)[1]:addr(8 * m + r)[1] + 8] for r in range(8)])
            if trans: mat = mat.T
            for t in range(32): out[t, m] = mat[t // 4, 2 * (t % 4):2 * (t % 4) + 2]
        return out
    def mma(acc, a, b0, b1):  # acc [32][4], a [32][4][2], b [32][2]
        A = np.zeros((16, 16)); B = np.zeros((16, 8))
        for t in range(32):
            gq, tq = t // 4, t % 4
            A[gq, 2 * tq:2 * tq + 2] = a[t, 0]; A[gq + 8, 2 * tq:2 * tq + 2] = a[t, 1]
            A[gq, 2 * tq + 8:2 * tq + 10] = a[t, 2]; A[gq + 8, 2 * tq + 8:2 * tq + 10] = a[t, 3]
            B[2 * tq:2 * tq + 2, gq] = b0[t]; B[2 * tq + 8:2 * tq + 10, gq] = b1[t]
        Cm = A @ B
        for t in range(32):
            gq, tq = t // 4, t % 4
            acc[t, 0:2] += Cm[gq, 2 * tq:2 * tq + 2]; acc[t, 2:4] += Cm[gq + 8, 2 * tq:2 * tq + 2]
    # products
    for w in range(8):
        kind, job = w >> 2, w & 3
        if job == 3: continue
        rt = 0 if job == 0 else 1; jt = 1 if job == 2 else 0
        acc = [np.zeros((32, 4)), np.zeros((32, 4))]
        for kk in range(8):
            a = ldsm("Ql" if kind else "Kl", 16 * rt, lambda l: ((l & 15), 16 * kk + 8 * (l >> 4)))
            b = ldsm("Kr", 16 * rt + 16 * jt, lambda l: ((l & 7) + 8 * (l >> 4), 16 * kk + 8 * ((l >> 3) & 1)))
            mma(acc[0], a, b[:, 0], b[:, 1]); mma(acc[1], a, b[:, 2], b[:, 3])
        for lane in range(32):
            gq, tq = lane // 4, lane % 4
            for n in range(2):
                for half in range(2):
                    i = 16 * rt + gq + 8 * half; j = 16 * jt + 8 * n + 2 * tq
                    x0, x1 = acc[n][lane, 2 * half], acc[n][lane, 2 * half + 1]
                    if kind == 0:
                        sm["Ak"][i, j:j + 2] = [bs[i] * x0 if j < i else 0, bs[i] * x1 if j + 1 < i else 0]
                    elif i < Lc:
                        gA[i, j:j + 2] = [x0 if j <= i else 0, x1 if j + 1 <= i else 0]
                        if job == 0: gA[i, j + 16:j + 18] = 0
    # diag inverse
    Ak = sm["Ak"]
    for lane in range(32):
        c, o = lane & 15, 16 * (lane >> 4); m = np.zeros(16)
        for i in range(16):
            a0 = 1.0 if i == c else 0.0
            for j in range(i): a0 -= Ak[o + i, o + j] * m[j]
            m[i] = a0
        for i in range(16): sm["Mi"][o + i, o + c] = m[i]
    for tid in range(256):
        i, j = tid >> 4, tid & 15
        sm["Xs"][i, j] = sum(Ak[16 + i, kq] * sm["Mi"][kq, j] for kq in range(16))
    Mi, Xs, Ts = sm["Mi"], sm["Xs"], sm["Ts"]
    for tid in range(256):
        i, j = tid >> 4, tid & 15
        mm = sum(Mi[16 + i, 16 + kq] * Xs[kq, j] for kq in range(16))
        Ts[16 + i, j] = -mm * bs[j]; Ts[i, j] = Mi[i, j] * bs[j]; Ts[16 + i, 16 + j] = Mi[16 + i, 16 + j] * bs[16 + j]; Ts[i, 16 + j] = 0
    for w in range(8):
        kind, rt, c0 = w >> 2, (w >> 1) & 1, 64 * (w & 1)
        B = "V" if kind else "KE"; dst = gU if kind else gW
        acc = [np.zeros((32, 4)) for _ in range(8)]
        for kk in range(2):
            if kk <= rt:
                a = ldsm("Ts", 16 * rt, lambda l: ((l & 15), 16 * kk + 8 * (l >> 4)))
                for p in range(4):
                    b = ldsm(B, 16 * kk, lambda l: ((l & 15), c0 + 16 * p + 8 * (l >> 4)), trans=True)
                    mma(acc[2 * p], a, b[:, 0], b[:, 1]); mma(acc[2 * p + 1], a, b[:, 2], b[:, 3])
        for lane in range(32):
            gq, tq = lane // 4, lane % 4
            for half in range(2):
                i = 16 * rt + gq + 8 * half
                if i < Lc:
                    for nt in range(8): dst[i, c0 + 8 * nt + 2 * tq:c0 + 8 * nt + 2 * tq + 2] = acc[nt][lane, 2 * half:2 * half + 2]
    def err(x, r): return np.nanmax(np.abs(x - r)) / np.abs(r).max() if not np.isnan(x).any() else float("nan")
    errs = {"Q": err(gQ[:Lc], Qr[:Lc]), "K": err(gK[:Lc], Kr_[:Lc]), "A": err(gA[:Lc], Aqk[:Lc]),
            "W": err(gW[:Lc], Wr[:Lc]), "U": err(gU[:Lc], Ur[:Lc]), "eL": err(eL, np.exp(Gl))}
    print(f"Lc {Lc:2d}: " + "  ".join(f"{n} {e:.1e}" for n, e in errs.items()))
    return all(e < 1e-12 for e in errs.values())  # False for NaN too
ok = all([run(Lc) for Lc in (32, 1, 17, 16, 31)])
print("OK" if ok else "MISMATCH")
raise SystemExit(0 if ok else 1)
