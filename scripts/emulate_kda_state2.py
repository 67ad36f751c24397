#!/usr/bin/env python3
"""CPU-only check of kda_tc_state2_kernel's index math (src/k3/backend/cuda/kda_tc_state2.cu): emulates every lane
of every warp of every block in float64 over whole (multi-sequence) calls: the cp.async loader (thread roles,
clamped row addresses, zero fill past the sequence end, the 3-buffer ring), the shared-memory layout as BYTE
addresses (region offsets, row strides), ldmatrix / ldmatrix.trans and mma.m16n8k16 fragment semantics as PTX
defines them, the C -> A repacking of S^T and V~^T, the skipped causal k-step, the O / chunk-state / final-state
stores; then compares with the direct recurrence per chunk
    V~ = U - W S;  O = Q S + A_qk V~;  S = diag(eL) S + K^T V~
on random operands (A_qk lower triangular with its diagonal, as the intra kernel writes it). No bf16 rounding: a
correct mapping agrees to ~1e-15, an indexing slip by O(1). Unwritten shared memory and global rows outside the
sequence are NaN, so reading them shows. Keep in step with the kernel. Usage: emulate_kda_state2.py"""
import numpy as np

rng = np.random.default_rng(0)
L, D = 32, 128
NBUF = 3
lane = np.arange(32)
gq, tq = lane >> 2, lane & 3


class Cfg:  # State2Cfg<NW>
    def __init__(self, NW):
        self.NW, self.NT, self.BV = NW, 32 * NW, 16 * NW
        self.LDB, self.LDA, self.LDU = D + 8, L + 8, self.BV + 8
        self.off_w, self.off_q, self.off_k, self.off_a = 0, L * self.LDB * 2, 2 * L * self.LDB * 2, 3 * L * self.LDB * 2
        self.off_u = self.off_a + L * self.LDA * 2
        self.off_e = self.off_u + L * self.LDU * 2
        self.buf_bytes = self.off_e + D * 4
        self.bytes = NBUF * self.buf_bytes
        assert all(x % 16 == 0 for x in (self.off_q, self.off_a, self.off_u, self.off_e, self.buf_bytes))


class Smem:  # byte-addressed: a bf16 at byte a lives in u16[a // 2]; an fp32 at byte a (4-aligned) in f32[a // 4]
    def __init__(self, nbytes):
        self.u16 = np.full(nbytes // 2, np.nan)
        self.f32 = np.full(nbytes // 4, np.nan)
        self.kind = np.zeros(nbytes // 2, dtype=np.int8)  # 1 = last written as bf16, 2 = as fp32

    def cp16_bf16(self, byte, src):  # 8 bf16
        assert byte % 16 == 0
        self.u16[byte // 2:byte // 2 + 8] = src
        self.kind[byte // 2:byte // 2 + 8] = 1

    def cp16_f32(self, byte, src):  # 4 floats
        assert byte % 16 == 0
        self.f32[byte // 4:byte // 4 + 4] = src
        self.kind[byte // 2:byte // 2 + 8] = 2

    def row8(self, byte):  # the 8 bf16 an ldmatrix lane addresses
        assert byte % 16 == 0 and (self.kind[byte // 2:byte // 2 + 8] == 1).all(), "ldmatrix reads non-bf16 data"
        return self.u16[byte // 2:byte // 2 + 8]

    def ld_f32(self, byte):
        assert byte % 4 == 0 and (self.kind[byte // 2:byte // 2 + 2] == 2).all(), "fp32 read of non-fp32 data"
        return self.f32[byte // 4]


def ldsm(sm, byte_addr, trans=False):  # byte_addr [32]; returns 4 registers, each [32][2] (lo, hi)
    regs = []
    for m in range(4):
        M = np.array([sm.row8(int(byte_addr[8 * m + r])) for r in range(8)])
        if trans:
            M = M.T
        regs.append(np.stack([M[gq, 2 * tq], M[gq, 2 * tq + 1]], axis=1))
    return regs


def mma(c, a, b0, b1):  # c [4][32] fp32 accumulators (updated), a: 4 registers, b0, b1 registers ([32][2])
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for f in range(4):  # a[f]: row gq + 8 (f & 1), columns 2 tq + 8 (f >> 1) + {0, 1}
        A[gq + 8 * (f & 1), 2 * tq + 8 * (f >> 1)] = a[f][:, 0]
        A[gq + 8 * (f & 1), 2 * tq + 8 * (f >> 1) + 1] = a[f][:, 1]
    for f, b in enumerate((b0, b1)):  # b[f]: rows (k) 2 tq + 8 f + {0, 1}, column gq
        B[2 * tq + 8 * f, gq] = b[:, 0]
        B[2 * tq + 8 * f + 1, gq] = b[:, 1]
    Cm = A @ B
    for e in range(4):  # c[e]: row gq + 8 (e >> 1), column 2 tq + (e & 1)
        c[e] += Cm[gq + 8 * (e >> 1), 2 * tq + (e & 1)]


def pack2(lo, hi):
    return np.stack([lo, hi], axis=1)


# --- the kernel, lane-vectorised (names and expressions as in kda_tc_state2.cu) -----------------------------
def state2_lane(cfg, warp):
    r, c = (lane & 7) + 8 * (lane >> 4), 8 * ((lane >> 3) & 1)
    return dict(offB=r * cfg.LDB + c, offA=r * cfg.LDA + c, offU=r * cfg.LDU + 16 * warp + c,
                offK=(lane & 15) * cfg.LDB + 8 * (lane >> 4))


def state2_load(cfg, sm, b, ws, r0, Lc, hcol, v0, C, H, h, erow):
    W, Q, K, A, U, eL = (b + cfg.off_w, b + cfg.off_q, b + cfg.off_k, b + cfg.off_a, b + cfg.off_u, b + cfg.off_e)
    for tid in range(cfg.NT):
        def cp(dst_base, dst_elem, plane, at, ok):  # cp_async16 of 8 bf16
            sm.cp16_bf16(dst_base + 2 * dst_elem, plane[at:at + 8] if ok else np.zeros(8))
        for it in range(L * (D // 8) // cfg.NT):
            e = tid + it * cfg.NT; i, d = e // (D // 8), 8 * (e % (D // 8))
            at = (r0 + min(i, Lc - 1)) * C + hcol + d
            cp(W, i * cfg.LDB + d, ws["W"], at, i < Lc)
            cp(Q, i * cfg.LDB + d, ws["Q"], at, i < Lc)
            cp(K, i * cfg.LDB + d, ws["K"], at, i < Lc)
        for it in range(L * (cfg.BV // 8) // cfg.NT):
            e = tid + it * cfg.NT; i, j = e // (cfg.BV // 8), 8 * (e % (cfg.BV // 8))
            cp(U, i * cfg.LDU + j, ws["U"], (r0 + min(i, Lc - 1)) * C + hcol + v0 + j, i < Lc)
        if tid < L * (L // 8):
            i, j = tid // (L // 8), 8 * (tid % (L // 8))
            cp(A, i * cfg.LDA + j, ws["A"], ((r0 + min(i, Lc - 1)) * H + h) * L + j, i < Lc)
        if tid < D // 4:
            sm.cp16_f32(eL + 4 * 4 * tid, ws["eL"][erow + 4 * tid:erow + 4 * tid + 4])


def state2_sfrag(st, j):
    return [pack2(st[2 * j][0], st[2 * j][1]), pack2(st[2 * j][2], st[2 * j][3]),
            pack2(st[2 * j + 1][0], st[2 * j + 1][1]), pack2(st[2 * j + 1][2], st[2 * j + 1][3])]


def state2_vnew(cfg, sm, b, ln, st):  # returns va [2][4 registers], ot [4][4][32]
    acc = np.zeros((4, 4, 32)); ot = np.zeros((4, 4, 32))
    W, Q, U = b + cfg.off_w, b + cfg.off_q, b + cfg.off_u
    for j in range(D // 16):
        a = state2_sfrag(st, j)
        for p in range(2):
            w = ldsm(sm, W + 2 * (ln["offB"] + 16 * p * cfg.LDB + 16 * j))
            q = ldsm(sm, Q + 2 * (ln["offB"] + 16 * p * cfg.LDB + 16 * j))
            mma(acc[2 * p], a, w[0], w[1]); mma(acc[2 * p + 1], a, w[2], w[3])
            mma(ot[2 * p], a, q[0], q[1]); mma(ot[2 * p + 1], a, q[2], q[3])
    vt = np.zeros((4, 4, 32))
    for p in range(2):
        u = ldsm(sm, U + 2 * (ln["offU"] + 16 * p * cfg.LDU), trans=True)
        for s in range(2):
            lo, hi, nt = u[2 * s], u[2 * s + 1], 2 * p + s
            vt[nt][0] = lo[:, 0] - acc[nt][0]; vt[nt][1] = lo[:, 1] - acc[nt][1]
            vt[nt][2] = hi[:, 0] - acc[nt][2]; vt[nt][3] = hi[:, 1] - acc[nt][3]
    va = [[pack2(vt[2 * kk][0], vt[2 * kk][1]), pack2(vt[2 * kk][2], vt[2 * kk][3]),
           pack2(vt[2 * kk + 1][0], vt[2 * kk + 1][1]), pack2(vt[2 * kk + 1][2], vt[2 * kk + 1][3])] for kk in range(2)]
    return va, ot


def state2_out(cfg, sm, b, ln, va, ot, Lc, o, o_w, C):
    A = b + cfg.off_a
    for p in range(2):
        for kk in range(p + 1):
            a = ldsm(sm, A + 2 * (ln["offA"] + 16 * p * cfg.LDA + 16 * kk))
            mma(ot[2 * p], va[kk], a[0], a[1]); mma(ot[2 * p + 1], va[kk], a[2], a[3])
    full = Lc == L
    for nt in range(4):
        for e in range(4):
            i = 8 * nt + 2 * tq + (e & 1)
            ok = full | (i < Lc)
            idx = o_w + i * C + gq + 8 * (e >> 1)
            o[idx[ok]] = ot[nt][e][ok]


def state2_update(cfg, sm, b, ln, va, st):
    K, eL = b + cfg.off_k, b + cfg.off_e
    for nt in range(16):
        ex = np.array([sm.ld_f32(eL + 4 * (8 * nt + 2 * t)) for t in tq])  # float2 at 8 nt + 2 tq: .x
        ey = np.array([sm.ld_f32(eL + 4 * (8 * nt + 2 * t + 1)) for t in tq])  # .y
        st[nt][0] *= ex; st[nt][1] *= ey; st[nt][2] *= ex; st[nt][3] *= ey
    for kk in range(2):
        for p in range(8):
            k = ldsm(sm, K + 2 * (ln["offK"] + 16 * kk * cfg.LDB + 16 * p), trans=True)
            mma(st[2 * p], va[kk], k[0], k[1]); mma(st[2 * p + 1], va[kk], k[2], k[3])


def state2_io(store, st, mem, S_w):
    for nt in range(16):
        for e in range(4):
            idx = S_w + (8 * nt + 2 * tq + (e & 1)) * D + gq + 8 * (e >> 1)
            if store:
                mem[idx] = st[nt][e]
            else:
                st[nt][e] = mem[idx]


def kernel_block(cfg, bx, by, bz, seqs, H, base, ws, o, cs, Sglob):
    sq = seqs[bx]
    if sq["n"] <= 0:
        return
    h, v0, C, cb = by, bz * cfg.BV, H * D, base[bx]
    hcol = h * D
    nch = (sq["n"] + L - 1) // L
    sm = Smem(cfg.bytes)

    def load(c):
        if c < nch:
            state2_load(cfg, sm, (c % NBUF) * cfg.buf_bytes, ws, sq["offset"] + c * L, min(L, sq["n"] - c * L),
                        hcol, v0, C, H, h, ((cb + c) * H + h) * D)
    for c in range(NBUF - 1):
        load(c)
    warps = []
    for warp in range(cfg.NW):
        vw = v0 + 16 * warp
        st = np.zeros((16, 4, 32))
        Sg = sq["S"] + hcol * D + vw
        state2_io(False, st, Sglob, Sg)
        warps.append((warp, vw, st, Sg, state2_lane(cfg, warp)))
    for c in range(nch):
        load(c + NBUF - 1)  # sequential emulation: after the barrier, into buffer (c - 1) % NBUF
        b = (c % NBUF) * cfg.buf_bytes
        t0 = c * L; Lc = min(L, sq["n"] - t0)
        for warp, vw, st, Sg, ln in warps:
            va, ot = state2_vnew(cfg, sm, b, ln, st)
            state2_out(cfg, sm, b, ln, va, ot, Lc, o, (sq["offset"] + t0) * C + hcol + vw, C)
            state2_update(cfg, sm, b, ln, va, st)
            if cs is not None:
                state2_io(True, st, cs, ((cb + c) * H + h) * D * D + vw)
    for warp, vw, st, Sg, ln in warps:
        state2_io(True, st, Sglob, Sg)


def run(NW, lens, H, want_cs=True):
    cfg = Cfg(NW)
    N, C = sum(lens), H * D
    offs = [sum(lens[:i]) for i in range(len(lens))]
    base, run_ = [], 0
    for n in lens:
        base.append(run_); run_ += (n + L - 1) // L if n > 0 else 0
    n_chunks = run_
    # workspace planes as the intra kernel leaves them: rows of every sequence's chunks; A_qk lower with diagonal
    ws = {"W": rng.standard_normal(N * C) * 0.05, "U": rng.standard_normal(N * C),
          "Q": rng.standard_normal(N * C) * 0.05, "K": rng.standard_normal(N * C) * 0.05}
    Aq = rng.standard_normal((N, H, L)) * 0.1
    for s, n in enumerate(lens):
        for t in range(n):
            Aq[offs[s] + t, :, (t % L) + 1:] = 0
    ws["A"] = Aq.reshape(-1)
    max_chunks = N // L + len(lens)
    eLw = np.full(max_chunks * H * D, np.nan)
    eLw[:n_chunks * H * D] = np.exp(-5 * rng.random(n_chunks * H * D))
    ws["eL"] = eLw
    S0 = rng.standard_normal(len(lens) * H * D * D) * 0.3
    Sglob = S0.copy()
    o = np.full(N * C, np.nan)
    cs = np.full(max(n_chunks, 1) * H * D * D, np.nan) if want_cs else None
    seqs = [dict(S=i * H * D * D, offset=offs[i], n=lens[i]) for i in range(len(lens))]
    for bx in range(len(lens)):
        for by in range(H):
            for bz in range(D // cfg.BV):
                kernel_block(cfg, bx, by, bz, seqs, H, base, ws, o, cs, Sglob)
    # reference
    o_ref = np.full(N * C, np.nan).reshape(N, H, D)
    S_ref = S0.copy().reshape(len(lens), H, D, D)
    cs_ref = np.full((max(n_chunks, 1), H, D, D), np.nan)
    W, U, Q, K = (ws[x].reshape(N, H, D) for x in "WUQK")
    for s, n in enumerate(lens):
        for c in range((n + L - 1) // L):
            r0, Lc = offs[s] + c * L, min(L, n - c * L)
            for h in range(H):
                S = S_ref[s, h]
                Vn = U[r0:r0 + Lc, h] - W[r0:r0 + Lc, h] @ S
                o_ref[r0:r0 + Lc, h] = Q[r0:r0 + Lc, h] @ S + Aq[r0:r0 + Lc, h, :Lc] @ Vn
                eL = eLw[((base[s] + c) * H + h) * D:((base[s] + c) * H + h + 1) * D]
                S_ref[s, h] = eL[:, None] * S + K[r0:r0 + Lc, h].T @ Vn
                cs_ref[base[s] + c, h] = S_ref[s, h]

    def err(x, r):  # NaN if anything the kernel should have written was not
        x, r = x.reshape(-1), r.reshape(-1)
        return float("nan") if np.isnan(x).any() else np.abs(x - r).max() / np.abs(r).max()
    errs = {"out": err(o, o_ref), "final state": err(Sglob, S_ref)}
    if want_cs:
        errs["chunk states"] = err(cs[:n_chunks * H * D * D], cs_ref[:n_chunks])
    print(f"{NW} warps H={H} lens={lens}: " + "  ".join(f"{k} {v:.1e}" for k, v in errs.items()), flush=True)
    return all(v < 1e-12 for v in errs.values())  # False for NaN too


ok = True
ok &= run(8, [1], 1)
ok &= run(8, [17], 2)
ok &= run(4, [32], 1)
ok &= run(8, [33, 0, 100], 2)
ok &= run(4, [31, 17, 0, 70], 2, want_cs=False)
ok &= run(4, [1, 65], 1)
print("OK" if ok else "MISMATCH")
raise SystemExit(0 if ok else 1)
