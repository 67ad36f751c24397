"""CPU tests: python3 -m unittest discover -s python/k3tiny/tests -t python  (or run this file directly)."""
import math
import os
import sys
import tempfile
import unittest

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))   # python/

from k3ref import mxfp4  # noqa: E402
from k3ref.config import parse_config  # noqa: E402
from k3ref.model import load_model, kda_recurrent as ref_recurrent  # noqa: E402
from k3tiny.k3tiny_cfg import tiny_test_config  # noqa: E402
from k3tiny.model_train import K3Tiny, kda_chunk, kda_recurrent, mxfp4_fake_quant  # noqa: E402
from k3tiny.export import export  # noqa: E402


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def perturb(model, seed=1):
    """Random non-trivial values for params that init to constants (norms, AttnRes, A_log, router bias)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or n.endswith("layernorm.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            elif n.endswith("_res_proj.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 2 / math.sqrt(p.shape[-1]))
            elif n.endswith("A_log"):
                p[:model.cfg.kda_num_heads] = torch.log(torch.rand(model.cfg.kda_num_heads, generator=g) * 0.8 + 0.6)
        for m in model.moe_layers():
            m.gate.e_score_correction_bias.copy_(torch.rand(m.E, generator=g) * 0.3 - 0.15)


class TestKDA(unittest.TestCase):
    def test_chunk_equals_recurrence(self):
        torch.manual_seed(0)
        for T, chunk in ((150, 64), (64, 64), (37, 32)):
            N, D = 3, 16
            q = torch.nn.functional.normalize(torch.randn(N, T, D, dtype=torch.float64), dim=-1) / math.sqrt(D)
            k = torch.nn.functional.normalize(torch.randn(N, T, D, dtype=torch.float64), dim=-1)
            v = torch.randn(N, T, D, dtype=torch.float64)
            g = -5 * torch.sigmoid(torch.randn(N, T, D, dtype=torch.float64) * 3 - 1)   # includes near -5
            beta = torch.sigmoid(torch.randn(N, T, dtype=torch.float64))
            o1, S1 = kda_chunk(q, k, v, g, beta, chunk=chunk)
            o2, S2 = kda_recurrent(q, k, v, g, beta)
            # and the project's reference recurrence ([T,H,D] layout)
            o3, S3 = ref_recurrent(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), g.transpose(0, 1),
                                   beta.transpose(0, 1), torch.zeros(N, D, D, dtype=torch.float64))
            self.assertLess(rel(o1, o2), 1e-10)
            self.assertLess(rel(S1, S2), 1e-10)
            self.assertLess(rel(o1, o3.transpose(0, 1)), 1e-10)
            # fp32
            o4, _ = kda_chunk(q.float(), k.float(), v.float(), g.float(), beta.float(), chunk=chunk)
            self.assertLess(rel(o4.double(), o2), 1e-5)

    def test_gradients_finite(self):
        torch.manual_seed(0)
        N, T, D = 2, 128, 16
        q = torch.randn(N, T, D, requires_grad=True)
        g = torch.full((N, T, D), -4.99, requires_grad=True)
        qn = torch.nn.functional.normalize(q, dim=-1) / 4
        k = torch.nn.functional.normalize(torch.randn(N, T, D), dim=-1)
        o, _ = kda_chunk(qn, k, torch.randn(N, T, D), g, torch.rand(N, T))
        o.sum().backward()
        self.assertTrue(torch.isfinite(q.grad).all() and torch.isfinite(g.grad).all())


class TestFakeQuant(unittest.TestCase):
    def test_equals_k3ref(self):
        rng = np.random.default_rng(0)
        w = rng.standard_normal((64, 256)).astype(np.float32) * np.exp(rng.uniform(-8, 4, (64, 1))).astype(np.float32)
        w[3, 32:64] = 0.0                                         # all-zero group
        w[5, :32] = np.float32(0.25) * np.arange(32) / 4          # exact ties
        w[6, :32] = np.float32(2.0 ** -130)                       # subnormal-ish tiny group
        w[7, :32] = 7.9e30
        for scale in (1.0, 0.75, 2.0 ** -3):
            ww = (w * np.float32(scale)).astype(np.float32)
            ref = mxfp4.dequantize(*mxfp4.quantize(ww))
            fq = mxfp4_fake_quant(torch.from_numpy(ww)).double().numpy()
            np.testing.assert_array_equal(fq, ref)
            fq64 = mxfp4_fake_quant(torch.from_numpy(ww).double()).numpy()
            np.testing.assert_array_equal(fq64, ref)
        # batched [E, out, in] layout (routed experts are stacked)
        w3 = torch.randn(4, 16, 64)
        ref = np.stack([mxfp4.dequantize(*mxfp4.quantize(w3[e].numpy())) for e in range(4)])
        np.testing.assert_array_equal(mxfp4_fake_quant(w3).double().numpy(), ref)


class TestForwardEquivalence(unittest.TestCase):
    def _check(self, mxfp4_experts, T=150):
        cfgd = tiny_test_config(mxfp4=mxfp4_experts)
        cfg = parse_config(cfgd)
        m = K3Tiny(cfg)
        m.reset_parameters(seed=5)
        perturb(m)
        with tempfile.TemporaryDirectory() as d:
            export(m.hf_tensors(), cfgd, d, mxfp4_experts)
            ref = load_model(d, dtype=torch.float64)
        # load the exported (bf16 / mxfp4-rounded) weights back, exactly as the reference sees them
        m.load_hf_tensors({k: v for k, v in ref.w.items()})
        m = m.double().eval()
        for mm in m.moe_layers():
            mm.gate.e_score_correction_bias.copy_(ref.w[f"language_model.model.layers.{mm_layer(m, mm)}.block_sparse_moe.gate.e_score_correction_bias"])
        toks = torch.randint(0, cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            out = m(toks)
        for b in range(2):
            lr = ref.forward(toks[b].tolist(), kda_mode="recurrent")
            r = rel(out[b], lr)
            self.assertLess(r, 1e-9, f"batch {b}: rel {r}")
            lc = ref.forward(toks[b].tolist(), kda_mode="chunk")
            self.assertLess(rel(out[b], lc), 1e-9)
        # fp32 training model vs float64 reference
        m32 = m.float()
        with torch.no_grad():
            out32 = m32(toks)
        r32 = max(rel(out32[b].double(), ref.forward(toks[b].tolist())) for b in range(2))
        print(f"\n[forward-equivalence mxfp4={mxfp4_experts}] float64 rel {r:.2e}, float32 rel {r32:.2e}, "
              f"min route margin {ref.stats['min_route_margin']:.2e}")
        self.assertLess(r32, 1e-4)

    def test_forward_equals_k3ref_mxfp4(self):
        self._check(True)

    def test_forward_equals_k3ref_bf16_experts(self):
        self._check(False, T=70)

    def test_qat_forward_equals_mxfp4_export(self):
        """QAT forward (fake-quant experts) on the bf16-rounded weights == reference on the MXFP4 export."""
        cfgd = tiny_test_config(mxfp4=True)
        cfg = parse_config(cfgd)
        m = K3Tiny(cfg)
        m.reset_parameters(seed=9)
        with tempfile.TemporaryDirectory() as d:
            export(m.hf_tensors(), without_quant_cfg(cfgd), d, False)      # bf16 everything
            bf = load_model(d, dtype=torch.float64)
        m.load_hf_tensors(bf.w)                                         # weights now bf16-representable
        with tempfile.TemporaryDirectory() as d:
            export(m.hf_tensors(), cfgd, d, True)
            ref = load_model(d, dtype=torch.float64)
        m = m.double().eval()
        m.set_qat(True)
        toks = torch.randint(0, cfg.vocab_size, (1, 80), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            out = m(toks)
        self.assertLess(rel(out[0], ref.forward(toks[0].tolist())), 1e-9)


def without_quant_cfg(c):
    from k3tiny.k3tiny_cfg import without_quant
    return without_quant(c)


def mm_layer(model, mm):
    for i, l in enumerate(model.layers):
        if getattr(l, "block_sparse_moe", None) is mm:
            return i
    raise KeyError


class TestTrainSmoke(unittest.TestCase):
    def test_train_30_steps_and_export(self):
        from k3tiny import train
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "data")
            train.write_fake_data(data, vocab=512, n_train=60000, n_val=8000, seed=0)
            out = os.path.join(d, "out")
            res = train.main(["--data", data, "--out", out, "--config", "tiny", "--steps", "30", "--batch", "8",
                              "--seq", "64", "--lr", "3e-3", "--warmup", "5", "--eval-every", "10",
                              "--eval-batches", "4", "--qat-frac", "0.3", "--device", "cpu"])
            print(f"\n[smoke] first loss {res['first_loss']:.4f} last loss {res['last_loss']:.4f} "
                  f"val {res['val_loss']:.4f} export {res['export']}")
            self.assertLess(res["last_loss"], res["first_loss"] - 0.3)
            ref = load_model(os.path.join(out, "hf"), dtype=torch.float32)
            lg = ref.forward([1, 2, 3, 4, 5])
            self.assertTrue(torch.isfinite(lg).all())
            self.assertTrue(os.path.exists(os.path.join(out, "log.jsonl")))


if __name__ == "__main__":
    unittest.main()


class TestEvaluate(unittest.TestCase):
    def test_ref_and_fast_agree(self):
        from k3tiny import evaluate
        cfgd = tiny_test_config(mxfp4=True)
        m = K3Tiny(parse_config(cfgd))
        m.reset_parameters(seed=2)
        with tempfile.TemporaryDirectory() as d:
            export(m.hf_tensors(), cfgd, os.path.join(d, "m"), True)
            np.random.default_rng(0).integers(0, 256, 300).astype("<u2").tofile(os.path.join(d, "t.bin"))
            r1 = evaluate.main(["--model", os.path.join(d, "m"), "--tokens", os.path.join(d, "t.bin"),
                                "--ctx", "128", "--impl", "ref"])[0]
            r2 = evaluate.main(["--model", os.path.join(d, "m"), "--tokens", os.path.join(d, "t.bin"),
                                "--ctx", "128", "--impl", "fast", "--device", "cpu"])[0]
            self.assertEqual(r1["tokens"], 300)
            self.assertEqual(r1["windows"], 3)
            self.assertAlmostEqual(r1["nll"], r2["nll"], places=4)
