"""Self-consistency tests of the k3ref reference. Run: /usr/bin/python3 -m unittest discover -s python/tests"""
import json
import os
import sys
import tempfile
import unittest

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from k3ref import mxfp4  # noqa: E402
from k3ref.config import load_config  # noqa: E402
from k3ref.model import (kda_chunked, kda_recurrent, l2_norm, load_model, mla_absorbed, mla_mha,  # noqa: E402
                         short_conv)
from k3ref.safetensors_io import BF16Array, load_dir, read_file, write_file, write_sharded  # noqa: E402

DATA = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "data"))
F64 = torch.float64


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


class TestKDA(unittest.TestCase):
    def inputs(self, T, H, D, seed, glow=-1.0):
        g = torch.Generator().manual_seed(seed)
        q = l2_norm(torch.randn(T, H, D, generator=g, dtype=F64)) / D ** 0.5
        k = l2_norm(torch.randn(T, H, D, generator=g, dtype=F64))
        v = torch.randn(T, H, D, generator=g, dtype=F64)
        gg = glow * torch.rand(T, H, D, generator=g, dtype=F64)
        beta = torch.rand(T, H, generator=g, dtype=F64)
        S = torch.randn(H, D, D, generator=g, dtype=F64)
        return q, k, v, gg, beta, S

    def test_chunk_equals_recurrence(self):
        for T in (1, 5, 16, 63, 64, 65, 130):
            for C in (1, 7, 16, 64):
                for glow in (-0.3, -5.0):
                    q, k, v, g, b, S = self.inputs(T, 3, 32, T * 100 + C, glow)
                    o1, S1 = kda_recurrent(q, k, v, g, b, S)
                    o2, S2 = kda_chunked(q, k, v, g, b, S, C)
                    self.assertLess(rel(o2, o1), 1e-5, (T, C, glow))
                    self.assertLess(rel(S2, S1), 1e-5, (T, C, glow))

    def test_split_state(self):
        q, k, v, g, b, S = self.inputs(100, 2, 16, 7)
        o, Sf = kda_recurrent(q, k, v, g, b, S)
        oa, Sa = kda_chunked(q[:37], k[:37], v[:37], g[:37], b[:37], S, 16)
        ob, Sb = kda_chunked(q[37:], k[37:], v[37:], g[37:], b[37:], Sa, 16)
        self.assertLess(rel(torch.cat([oa, ob]), o), 1e-10)
        self.assertLess(rel(Sb, Sf), 1e-10)

    def test_short_conv_streaming(self):
        x = torch.randn(20, 6, dtype=F64)
        w = torch.randn(6, 4, dtype=F64)
        y, _ = short_conv(x, w, torch.zeros(6, 3, dtype=F64))
        ref = torch.nn.functional.silu(torch.nn.functional.conv1d(x.T[None], w[:, None, :], padding=3, groups=6)[0, :, :20].T)
        self.assertLess(rel(y, ref), 1e-12)
        st = torch.zeros(6, 3, dtype=F64)
        ys = []
        for t in range(20):
            yt, st = short_conv(x[t:t + 1], w, st)
            ys.append(yt)
        self.assertLess(rel(torch.cat(ys), ref), 1e-12)


class TestMLA(unittest.TestCase):
    def test_absorbed_equals_mha(self):
        g = torch.Generator().manual_seed(0)
        nh, nope, rope, vd, r = 4, 16, 8, 12, 32
        for S, T in ((1, 1), (10, 10), (30, 7), (30, 1)):
            P = S - T
            q = torch.randn(T, nh, nope + rope, generator=g, dtype=F64)
            c = torch.randn(S, r, generator=g, dtype=F64)
            kp = torch.randn(S, rope, generator=g, dtype=F64)
            w = torch.randn(nh * (nope + vd), r, generator=g, dtype=F64)
            a = mla_mha(q, c, kp, w, nope, vd, P, 0.2)
            b = mla_absorbed(q, c, kp, w, nope, vd, P, 0.2)
            self.assertLess(rel(b, a), 1e-12)


class TestModels(unittest.TestCase):
    def check(self, name):
        m = load_model(os.path.join(DATA, name), F64)
        toks = np.random.default_rng(5).integers(0, 768, 80).tolist()
        lp = m.forward(toks, chunk=32)
        st = m.new_state()
        ld = torch.cat([m.forward([t], st, "recurrent", "absorbed") for t in toks])
        self.assertLess(rel(ld, lp), 1e-10)
        st = m.new_state()
        ls = torch.cat([m.forward(toks[:30], st), m.forward(toks[30:33], st, "recurrent", "absorbed"),
                        m.forward(toks[33:], st, "chunk", "absorbed", 16)])
        self.assertLess(rel(ls, lp), 1e-10)
        self.assertGreater(lp.std().item(), 0.5)

    def test_k3(self):
        self.check("tiny-k3")

    def test_kimi_linear(self):
        self.check("tiny-kimi-linear")

    def test_goldens(self):
        for name in ("tiny-k3", "tiny-kimi-linear"):
            gd = os.path.join(DATA, "goldens", name)
            with open(os.path.join(gd, "tokens.json")) as f:
                toks = json.load(f)
            m = load_model(os.path.join(DATA, name), F64)
            lp = m.forward(toks).numpy()
            gp = np.load(os.path.join(gd, "logits_prefill.npy"))
            self.assertEqual(gp.shape, (100, m.cfg.vocab_size))
            self.assertLess(np.abs(lp - gp).max() / np.abs(gp).max(), 1e-6)


class TestMXFP4(unittest.TestCase):
    def test_representable_roundtrip(self):
        rng = np.random.default_rng(0)
        vals = np.concatenate([mxfp4.E2M1_VALUES, -mxfp4.E2M1_VALUES])
        for e in (-10, -3, 0, 5):
            w = rng.choice(vals, size=(8, 64)) * 2.0 ** e
            w[:, 0] = 6.0 * 2.0 ** e        # every group's amax is 6*2^e -> scale exponent e
            w[:, 32] = -4.0 * 2.0 ** e
            pk, sc = mxfp4.quantize(w)
            self.assertEqual(pk.shape, (8, 32))
            self.assertEqual(sc.shape, (8, 2))
            self.assertTrue((sc == 127 + e).all())
            np.testing.assert_array_equal(mxfp4.dequantize(pk, sc), w)

    def test_layout_and_rounding(self):
        w = np.zeros((1, 32))
        w[0, 0], w[0, 1], w[0, 2], w[0, 3] = 1.0, -0.5, 6.0, 2.5   # scale 2^0 (amax 6 -> floor(log2 6) - 2 = 0)
        pk, sc = mxfp4.quantize(w)
        self.assertEqual(sc[0, 0], 127)
        self.assertEqual(pk[0, 0], 0x2 | (0x9 << 4))   # element 0 low nibble (1.0 = code 2), element 1 high (-0.5)
        self.assertEqual(pk[0, 1] & 0xF, 7)              # 6.0
        self.assertEqual(pk[0, 1] >> 4, 4)               # 2.5 ties to even code 4 (2.0)
        z = mxfp4.quantize(np.zeros((2, 64)))
        self.assertTrue((z[0] == 0).all() and (z[1] == 127).all())
        np.testing.assert_array_equal(mxfp4.dequantize(*z), np.zeros((2, 64)))

    def test_error_bound(self):
        w = np.random.default_rng(1).standard_normal((16, 128))
        d = mxfp4.dequantize(*mxfp4.quantize(w))
        g = np.abs(w.reshape(16, 4, 32)).max(-1, keepdims=True)
        err = np.abs((d - w).reshape(16, 4, 32))
        self.assertTrue((err <= g / 4 * 1.0000001).all())   # step size <= 2^e, amax in [4,8)*2^e -> err <= amax/4


class TestSafetensors(unittest.TestCase):
    def test_roundtrip(self):
        rng = np.random.default_rng(0)
        t = {"a.f32": rng.standard_normal((3, 5)).astype(np.float32),
             "b.f16": rng.standard_normal((7,)).astype(np.float16),
             "c.u8": rng.integers(0, 256, (4, 2)).astype(np.uint8),
             "d.bf16": BF16Array.from_f32(rng.standard_normal((2, 3, 4)))}
        with tempfile.TemporaryDirectory() as d:
            write_file(os.path.join(d, "x.safetensors"), t, {"format": "pt"})
            r, meta = read_file(os.path.join(d, "x.safetensors"))
            self.assertEqual(meta, {"format": "pt"})
            for n in ("a.f32", "b.f16", "c.u8"):
                self.assertEqual(r[n].dtype, t[n].dtype)
                np.testing.assert_array_equal(r[n], t[n])
            np.testing.assert_array_equal(r["d.bf16"].bits, t["d.bf16"].bits)
            write_sharded(os.path.join(d, "sh"), t, 3)
            r2 = load_dir(os.path.join(d, "sh"))
            self.assertEqual(set(r2), set(t))
            with open(os.path.join(d, "sh", "model.safetensors.index.json")) as f:
                self.assertEqual(len(set(json.load(f)["weight_map"].values())), 3)

    def test_bf16_rounding(self):
        x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, 3.140625], dtype=np.float32)
        b = BF16Array.from_f32(x).to_f32()
        np.testing.assert_array_equal(b, np.array([1.0, 1.0, 1.0 + 2 ** -6, -2.5, 3.140625], dtype=np.float32))

    def test_tiny_checkpoints_schema(self):
        k3 = load_config(os.path.join(DATA, "tiny-k3"))
        t = load_dir(os.path.join(DATA, "tiny-k3"))
        p = "language_model.model.layers.1.block_sparse_moe.experts.0."
        self.assertEqual(t[p + "w1.weight_packed"].shape, (64, 32))
        self.assertEqual(t[p + "w1.weight_scale"].shape, (64, 2))
        self.assertEqual(t["language_model.model.layers.0.self_attn.A_log"].shape, (128,))
        self.assertEqual(t["language_model.model.layers.0.self_attn.q_conv1d.weight"].dtype, np.float32)
        self.assertTrue(k3.mxfp4_experts and k3.is_kda(0) and not k3.is_kda(3))
        kl = load_dir(os.path.join(DATA, "tiny-kimi-linear"))
        self.assertEqual(kl["model.layers.0.self_attn.A_log"].shape, (1, 1, 3, 1))


if __name__ == "__main__":
    unittest.main()
