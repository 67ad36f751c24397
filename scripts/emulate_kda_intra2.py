#!/usr/bin/env python3
"""CPU-only check of kda_tc_intra2_kernel's index math (src/k3/backend/cuda/kda_chunked_tc.cu): emulates every
lane of every warp in float64 (the load / scan lane roles, the shuffles, ldmatrix and mma.m16n8k16 fragment
semantics as PTX defines them, the shared-memory layout, the blocked inverse) and compares the workspace
outputs (Q exp(G), exp(G_last - G) k, A_qk, W, U, exp(G_last)) with the direct chunk math. No bf16 rounding:
a correct mapping agrees to ~1e-15, an indexing slip by O(1); unwritten shared memory is NaN, so reading it
shows. check_v3 covers kda_tc_intra3_kernel's own index math (work items, the prefetch stage). Keep it in step
with the kernels when either changes. Usage: emulate_kda_intra2.py"""
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


def check_v3():
    """kda_tc_intra3_kernel's new index math (its arithmetic is v2's, emulated above): the work-item -> (chunk,
    head) mapping of the persistent loop, the prefetch hand-off (each block consumes exactly the item it staged),
    the cp.async stage addressing (swizzled 16-byte chunks, zero-fill past Lc, clamped source rows) against the
    tile each thread reads back, the tile reads' bank wavefronts, and the shared-memory regions."""
    ok = True
    # --- shared-memory layout (Intra2Cfg, Intra3Cfg)
    plane2 = L * LDB * 2
    off_ke, off_v, off_ql, off_kl, off_kr = 0, plane2, 2 * plane2, 3 * plane2, 4 * plane2
    off_ak = off_kr + 48 * LDB * 2; off_bs = off_ak + L * LDK * 4; bytes2 = off_bs + L * 4
    off_mi = off_ql; off_xs = off_mi + L * LDK * 4; off_ts = off_xs + 16 * LDX * 4; ts_end = off_ts + L * LDT * 2
    plane3 = L * D * 2
    off_g = bytes2; off_k = off_g + plane3; off_b = off_k + plane3; bytes3 = off_b + L * 4
    off_q3 = off_kl; off_v3 = off_q3 + plane3
    per_sm, reserved = 228 * 1024, 1024
    checks = {"late planes inside Kl+Kr": off_kl <= off_q3 and off_v3 + plane3 <= off_ak,
              "inverse scratch clear of them": ts_end <= off_q3,
              "3 blocks per SM": 3 * (bytes3 + reserved) <= per_sm,
              "16-byte alignment": all(x % 16 == 0 for x in (off_g, off_k, off_b, off_q3, off_v3))}
    print(f"v3 shared memory {bytes3} B (v2 {bytes2}): " + ", ".join(f"{n} {'ok' if c else 'FAIL'}" for n, c in checks.items()))
    ok &= all(checks.values())

    def stage_off(r, c): return r * 256 + 16 * (c ^ (2 * ((r >> 2) & 3)))
    # every 16-byte chunk of a plane written exactly once
    offs = sorted(stage_off(r, c) for r in range(32) for c in range(16))
    if offs != list(range(0, plane3, 16)): print("v3 stage swizzle is not a permutation"); ok = False
    # tile reads: wavefronts per warp-wide 8-byte load (32 banks of 4 bytes; a wavefront serves one 4-byte word per bank)
    worst = 0
    for w in range(8):
        for u in range(4):
            words = {}
            for lane in range(32):
                seg, cg = lane >> 2, lane & 3; r0, d = 4 * seg, 16 * w + 4 * cg
                at = stage_off(r0 + u, d >> 3) + 2 * (d & 7)
                for b in (at, at + 4): words.setdefault((b // 4) % 32, set()).add(b // 4)
            worst = max(worst, max(len(x) for x in words.values()))
    print(f"v3 tile reads: {worst} wavefronts per 8-byte warp load (2 is the minimum)")
    ok &= worst == 2

    # --- the stage round trip for partial chunks: cp.async (thread, j) -> bytes -> intra3_read -> tile
    C = 3 * D  # H = 3, head 1
    for Lc in (32, 1, 17, 16, 31):
        rows = rng.integers(0, 1 << 16, size=(Lc + 1, C))  # one row past the chunk: must not be copied
        stage = np.full(plane3 // 2, -1, dtype=np.int64)  # bf16 slots, -1 = never written
        h = 1
        for tid in range(256):
            for j in range(2):
                e = tid + 256 * j; r, c = e >> 4, e & 15; okr = r < Lc
                src = rows[r if okr else 0, h * D + 8 * c: h * D + 8 * c + 8]
                o = stage_off(r, c) // 2
                stage[o:o + 8] = src if okr else 0
        bad = 0
        for tid in range(256):
            lane = tid % 32; seg, cg = lane >> 2, lane & 3; r0, d = 4 * seg, 16 * (tid // 32) + 4 * cg
            for u in range(4):
                at = (stage_off(r0 + u, d >> 3) + 2 * (d & 7)) // 2
                want = rows[r0 + u, h * D + d:h * D + d + 4] if r0 + u < Lc else np.zeros(4)
                bad += not np.array_equal(stage[at:at + 4], want)
        if bad or (stage < 0).any(): print(f"v3 stage round trip Lc {Lc}: {bad} bad tiles"); ok = False

    # --- work items: the base table, the persistent loop, the prefetch chain
    def seq_of_chunk(base, n_seqs, b):
        lo, hi = 0, n_seqs - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if base[mid] <= b: lo = mid
            else: hi = mid - 1
        return lo
    for lens, H, grid_cap in [([1], 3, 396), ([16, 17, 15], 3, 396), ([0, 33, 0, 95, 0], 4, 396), ([1000] * 8, 32, 396),
                              ([257, 0, 64, 65, 1, 129, 511], 2, 7), ([8192], 96, 396), ([0, 0, 5], 1, 396), ([100, 3], 32, 7)]:
        n_seqs = len(lens); offs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(int); N = sum(lens)
        base, run_ = [], 0
        for n in lens: base.append(run_); run_ += (n + L - 1) // L if n > 0 else 0
        base.append(run_)
        n_items = base[n_seqs] * H
        items_ub = (N // L + n_seqs) * H
        grid = min(items_ub, grid_cap)
        seen = {}
        if n_items > items_ub: print("v3 item upper bound too small"); ok = False
        for x in range(grid):
            if x >= n_items: continue  # the block returns at once
            def item(it):
                b = it // H; hh = it - b * H; s_ = seq_of_chunk(base, n_seqs, b); t0 = (b - base[s_]) * L
                return dict(b=b, h=hh, s=s_, t0=t0, Lc=min(L, lens[s_] - t0), row0=offs[s_] + t0)
            def item_bh(b, hh):
                s_ = seq_of_chunk(base, n_seqs, b); t0 = (b - base[s_]) * L
                return dict(b=b, h=hh, s=s_, t0=t0, Lc=min(L, lens[s_] - t0), row0=offs[s_] + t0)
            step_b, step_h = grid // H, grid - (grid // H) * H
            def next_item(c):  # the kernel's division-free step to item it + grid
                hh = c["h"] + step_h; wrap = 1 if hh >= H else 0
                return item_bh(c["b"] + step_b + wrap, hh - wrap * H)
            it = x; staged = item_bh(it // H, it % H)  # the prologue's copies
            cur = staged
            while True:
                if cur != item(it): print(f"v3 item stepping: block {x} item {it}"); ok = False
                if staged != cur: print(f"v3 prefetch hand-off: block {x} item {it}"); ok = False
                nx = it + grid; more = nx < n_items
                if more:
                    staged = next_item(cur)  # early group
                    if next_item(cur) != staged: ok = False  # late group: the same lookup again
                key = (cur["s"], cur["t0"], cur["h"])
                if key in seen or not (1 <= cur["Lc"] <= L) or cur["t0"] % L or cur["row0"] + cur["Lc"] > offs[cur["s"]] + lens[cur["s"]]:
                    print(f"v3 bad item {it}: {cur}"); ok = False
                seen[key] = (cur["b"] * H + cur["h"]) * D  # exp(G_last)'s offset
                if not more: break
                it = nx; cur = staged
        want = {(s_, t0, hh) for s_, n in enumerate(lens) for t0 in range(0, n, L) for hh in range(H)}
        if set(seen) != want or len(set(seen.values())) != len(seen):
            print(f"v3 items do not cover lens {lens} H {H} exactly once"); ok = False
        per_block = -(-n_items // grid) if grid else 0
        print(f"v3 lens {lens if len(lens) < 8 else f'{len(lens)} x {lens[0]}'} H {H}: {n_items} items on {grid} blocks "
              f"(up to {per_block} per block) covered once")
    return ok


ok = all([run(Lc) for Lc in (32, 1, 17, 16, 31)])
ok = check_v3() and ok
print("OK" if ok else "MISMATCH")
raise SystemExit(0 if ok else 1)
