"""Trainable, batched Kimi K3 (text) model for k3-tiny (PyTorch >= 1.13; bf16 autocast on CUDA).

Same architecture as the reference python/k3ref/model.py (docs/model-spec.md sections 3.1-3.4), written for
training: batched over [batch, time], chunked KDA over [batch*heads], MLA through
F.scaled_dot_product_attention (manual fallback on torch < 2.0), LatentMoE with all routed experts of a layer
run as three batched matmuls over a [E, cap, X] buffer (cap = the largest expert load of the step: no token
is ever dropped, so the math is exactly the reference's top-k MoE).

Parameter names are the HF tensor names minus the prefix "language_model.model." (lm_head ->
"language_model.lm_head.weight"), with ONE exception: the routed experts of a layer are stacked,
block_sparse_moe.experts.w1 [E, I, X] (w3 the same, w2 [E, X, I]); hf_tensors() splits them into
experts.{e}.w1.weight etc. A_log is [128] like K3's checkpoints (only the first Hk entries are used).
The router bias gate.e_score_correction_bias is a buffer (updated by update_router_bias, never by gradient).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
A_LOG_LEN = 128
ACC = [torch.float32]   # accumulation dtype: float32, or float64 when the model itself is float64 (tests)   # K3 stores A_log as [128], zero-padded past the first Hk entries


# ------------------------------------------------------------------------------------------------ helpers
def rms_norm(x, w: Optional[torch.Tensor], eps: float):
    """fp32 RMSNorm; returns fp32."""
    x = x.to(ACC[0])
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w.to(ACC[0]) if w is not None else y


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def situ_glu(g, u, beta=4.0, lbeta=25.0):
    return beta * torch.tanh(g / beta) * torch.sigmoid(g) * (lbeta * torch.tanh(u / lbeta))


def glu(cfg, g, u):
    if cfg.hidden_act == "silu":
        return F.silu(g) * u
    return situ_glu(g, u, cfg.activation_situ_beta, cfg.activation_situ_linear_beta)


def _no_autocast(device_type):
    try:
        return torch.autocast(device_type=device_type, enabled=False)
    except Exception:  # pragma: no cover
        return torch.cuda.amp.autocast(enabled=False)


# ------------------------------------------------------------------------------------------------ MXFP4 fake quant
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def mxfp4_fake_quant(w: torch.Tensor, group: int = 32) -> torch.Tensor:
    """Quantise->dequantise along the last dim in groups of 32, bit-exactly like k3ref.mxfp4 (for fp32 w):
    scale 2^(floor(log2 amax) - 2) (E8M0 byte clamped to [0, 254], 127 for an all-zero group), values round
    to the nearest E2M1 value with ties to the even code, saturating at 6. No gradient (use mxfp4_ste)."""
    with torch.no_grad():
        shp = w.shape
        x = (w if w.dtype == torch.float64 else w.float()).reshape(*shp[:-1], shp[-1] // group, group)
        amax = x.abs().amax(-1, keepdim=True)
        _, ex = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
        e = ex.to(torch.int64) - 1 - 2                              # floor(log2(amax)) - 2 (exact)
        s = torch.where(amax > 0, e + 127, torch.full_like(e, 127)).clamp(0, 254) - 127
        sc = torch.pow(2.0, s.double()).to(x.dtype)
        y = x / sc
        a = y.abs().clamp(max=6.0)
        code = ((a > 0.25).to(torch.int64) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5)
                + (a >= 3.5) + (a > 5.0))
        lut = torch.tensor(_E2M1, dtype=x.dtype, device=w.device)
        q = lut[code] * torch.sign(y) * sc
        return q.reshape(shp).to(w.dtype)


def mxfp4_ste(w: torch.Tensor) -> torch.Tensor:
    """Fake-quantised weight in the forward, identity gradient (straight-through estimator)."""
    return w + (mxfp4_fake_quant(w) - w).detach()


# ------------------------------------------------------------------------------------------------ KDA core
def kda_chunk(q, k, v, g, beta, chunk: int = 64, sub: int = 16, S0=None):
    """Chunked KDA (WY/UT form of spec 3.2), batched. q,k,v,g: [N, T, D] fp32 (N = batch*heads; q already
    L2-normalised and scaled by 1/sqrt(D), k L2-normalised, g <= 0 per-channel log decay, K3 bound g > -5);
    beta [N, T]. Returns (o [N, T, D], S_final [N, D, D]).

    Intra-chunk decay products exp(G_i - G_j) are factorised per 16-row tile with the tile's first position r
    as reference: (k_i e^{G_i - G_r}) . (k_j e^{G_r - G_j}). For the valid j <= i of a row tile both exponents
    are <= 0 except inside the diagonal tile, where G_r - G_j <= 15 * 5 = 75 (fp32-safe); exponents of
    masked-out (j beyond the tile) entries are clamped so nothing overflows."""
    N, T, D = q.shape
    C = chunk
    pad = (-T) % C
    if pad:
        q, k, v, g = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    Tp = T + pad
    nc = Tp // C
    ns = C // sub
    q, k, v, g = (t.reshape(N, nc, C, D) for t in (q, k, v, g))
    beta = beta.reshape(N, nc, C)
    G = torch.cumsum(g, dim=2)                                      # [N,nc,C,D]
    Gr = G[:, :, ::sub, :]                                          # [N,nc,ns,D] tile reference (first row)
    Gt = G.reshape(N, nc, ns, sub, D)
    row_f = torch.exp(Gt - Gr.unsqueeze(3))                         # <= 1, [N,nc,ns,sub,D]
    col_f = torch.exp((Gr.unsqueeze(3) - G.unsqueeze(2)).clamp(max=80.0))   # [N,nc,ns,C,D]
    kt = k.reshape(N, nc, ns, sub, D)
    qt = q.reshape(N, nc, ns, sub, D)
    kc = k.unsqueeze(2) * col_f                                     # [N,nc,ns,C,D]
    Akk = torch.matmul(kt * row_f, kc.transpose(-1, -2)).reshape(N, nc, C, C)
    Aqk = torch.matmul(qt * row_f, kc.transpose(-1, -2)).reshape(N, nc, C, C)
    idx = torch.arange(C, device=q.device)
    strict = idx[None, :] < idx[:, None]
    incl = idx[None, :] <= idx[:, None]
    Akk = torch.where(strict, Akk * beta.unsqueeze(-1), torch.zeros_like(Akk))
    Aqk = torch.where(incl, Aqk, torch.zeros_like(Aqk))
    eye = torch.eye(C, device=q.device, dtype=q.dtype)
    # T = (I + A_kk)^-1 diag(beta): solve the unit-lower-triangular system
    Tm = torch.linalg.solve_triangular(eye + Akk, torch.diag_embed(beta), upper=False, unitriangular=True)
    eG = torch.exp(G)
    W = torch.matmul(Tm, eG * k)                                    # [N,nc,C,D]
    U = torch.matmul(Tm, v)
    GC = G[:, :, -1:, :]                                            # [N,nc,1,D]
    Kd = torch.exp(GC - G) * k                                      # [N,nc,C,D]
    dec = torch.exp(GC[:, :, 0, :]).unsqueeze(-1)                   # [N,nc,D,1]
    S = torch.zeros(N, D, D, device=q.device, dtype=q.dtype) if S0 is None else S0
    S_in, Vts = [], []
    for c in range(nc):
        S_in.append(S)
        Vt = U[:, c] - torch.matmul(W[:, c], S)
        Vts.append(Vt)
        S = dec[:, c] * S + torch.matmul(Kd[:, c].transpose(-1, -2), Vt)
    S_in = torch.stack(S_in, 1)                                     # [N,nc,D,D]
    Vt = torch.stack(Vts, 1)                                        # [N,nc,C,D]
    o = torch.matmul(q * eG, S_in) + torch.matmul(Aqk, Vt)
    o = o.reshape(N, Tp, D)[:, :T]
    return o, S


def kda_recurrent(q, k, v, g, beta, S0=None):
    """Token-by-token reference recurrence (tests). Same layout as kda_chunk."""
    N, T, D = q.shape
    S = torch.zeros(N, D, D, dtype=q.dtype) if S0 is None else S0.clone()
    out = []
    for t in range(T):
        S = torch.exp(g[:, t]).unsqueeze(-1) * S
        kv = torch.einsum("nk,nkv->nv", k[:, t], S)
        u = beta[:, t, None] * (v[:, t] - kv)
        S = S + k[:, t, :, None] * u[:, None, :]
        out.append(torch.einsum("nk,nkv->nv", q[:, t], S))
    return torch.stack(out, 1), S


# ------------------------------------------------------------------------------------------------ layers
def _lin(i, o):
    return nn.Linear(i, o, bias=False)


class KDA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, Hk, D, Kc = cfg.hidden_size, cfg.kda_num_heads, cfg.kda_head_dim, cfg.short_conv_kernel_size
        assert Hk <= A_LOG_LEN
        self.cfg, self.Hk, self.D, self.Kc = cfg, Hk, D, Kc
        C = Hk * D
        self.q_proj, self.k_proj, self.v_proj = _lin(H, C), _lin(H, C), _lin(H, C)
        self.q_conv1d = nn.Conv1d(C, C, Kc, groups=C, bias=False)
        self.k_conv1d = nn.Conv1d(C, C, Kc, groups=C, bias=False)
        self.v_conv1d = nn.Conv1d(C, C, Kc, groups=C, bias=False)
        self.f_a_proj = _lin(H, D)
        self.f_b_proj = _lin(D, C)
        self.dt_bias = nn.Parameter(torch.zeros(C))
        self.A_log = nn.Parameter(torch.zeros(A_LOG_LEN))
        self.b_proj = _lin(H, Hk)
        if not cfg.use_full_rank_gate:
            raise ValueError("k3tiny trains K3 layers: use_full_rank_gate must be true")
        if cfg.gate_lower_bound is None:
            raise ValueError("k3tiny trains K3 layers: gate_lower_bound must be set")
        self.g_proj = _lin(H, C)
        self.o_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.o_proj = _lin(C, H)

    def conv(self, x, conv):   # x [B,T,C] -> SiLU(causal depthwise conv)
        T = x.shape[1]
        y = F.conv1d(F.pad(x.transpose(1, 2), (self.Kc - 1, 0)), conv.weight.to(x.dtype), groups=x.shape[-1])
        return F.silu(y[..., :T]).transpose(1, 2)

    def forward(self, x):
        B, T, _ = x.shape
        Hk, D = self.Hk, self.D
        q = self.conv(self.q_proj(x), self.q_conv1d)
        k = self.conv(self.k_proj(x), self.k_conv1d)
        v = self.conv(self.v_proj(x), self.v_conv1d)
        z = self.f_b_proj(self.f_a_proj(x))
        braw = self.b_proj(x)
        gate = self.g_proj(x)
        with _no_autocast(x.device.type):
            z = z.to(ACC[0]) + self.dt_bias.to(ACC[0])
            A = torch.exp(self.A_log.to(ACC[0])[:Hk]).repeat_interleave(D)          # [C]
            g = self.cfg.gate_lower_bound * torch.sigmoid(A * z)                  # [B,T,C]
            beta = torch.sigmoid(braw.to(ACC[0]))                                    # [B,T,Hk]

            def heads(t):
                return t.to(ACC[0]).reshape(B, T, Hk, D).transpose(1, 2).reshape(B * Hk, T, D)
            qh = heads(q)
            qh = qh / torch.sqrt(qh.pow(2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(D)
            kh = heads(k)
            kh = kh / torch.sqrt(kh.pow(2).sum(-1, keepdim=True) + 1e-6)
            o, _ = kda_chunk(qh, kh, heads(v), heads(g), beta.transpose(1, 2).reshape(B * Hk, T))
            o = o.reshape(B, Hk, T, D).transpose(1, 2)                           # [B,T,Hk,D]
            y = self.o_norm(o) * torch.sigmoid(gate.to(ACC[0]).reshape(B, T, Hk, D))
        return self.o_proj(y.reshape(B, T, Hk * D))


class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        self.cfg, self.nh = cfg, nh
        self.nope, self.rope, self.vd, self.r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        if not cfg.q_lora_rank:
            raise ValueError("k3tiny trains K3 layers: q_lora_rank required")
        self.q_a_proj = _lin(H, cfg.q_lora_rank)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = _lin(cfg.q_lora_rank, nh * (self.nope + self.rope))
        self.kv_a_proj_with_mqa = _lin(H, self.r + self.rope)
        self.kv_a_layernorm = RMSNorm(self.r, cfg.rms_norm_eps)
        self.kv_b_proj = _lin(self.r, nh * (self.nope + self.vd))
        self.o_proj = _lin(nh * self.vd, H)
        if not cfg.mla_use_output_gate:
            raise ValueError("k3tiny trains K3 layers: mla_use_output_gate required")
        self.g_proj = _lin(H, nh * self.vd)

    def forward(self, x):
        B, T, _ = x.shape
        nh, nope, rope, vd, r = self.nh, self.nope, self.rope, self.vd, self.r
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).reshape(B, T, nh, nope + rope).transpose(1, 2)
        kv = self.kv_a_proj_with_mqa(x)
        c = self.kv_a_layernorm(kv[..., :r])
        kpe = kv[..., r:]
        kvb = self.kv_b_proj(c).reshape(B, T, nh, nope + vd).transpose(1, 2)
        k_nope, v = kvb[..., :nope], kvb[..., nope:]
        k = torch.cat([k_nope, kpe.unsqueeze(1).expand(B, nh, T, rope).to(k_nope.dtype)], -1)
        q = q.to(k.dtype)
        scale = 1.0 / math.sqrt(nope + rope)
        if HAS_SDPA:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # default scale = 1/sqrt(q.size(-1))
        else:
            sc = torch.matmul(q, k.transpose(-1, -2)) * scale
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            o = torch.matmul(torch.softmax(sc.masked_fill(mask, float("-inf")), -1), v)
        o = o.transpose(1, 2).reshape(B, T, nh * vd)
        o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg, H, I):
        super().__init__()
        self.cfg = cfg
        self.gate_proj, self.up_proj, self.down_proj = _lin(H, I), _lin(H, I), _lin(I, H)

    def forward(self, x):
        return self.down_proj(glu(self.cfg, self.gate_proj(x), self.up_proj(x)))


class Router(nn.Module):
    def __init__(self, H, E):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(E, H))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))


class Experts(nn.Module):
    """Stacked routed experts: w1/w3 [E, I, X] (gate/up), w2 [E, X, I] (down)."""

    def __init__(self, E, X, I):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(E, I, X))
        self.w3 = nn.Parameter(torch.empty(E, I, X))
        self.w2 = nn.Parameter(torch.empty(E, X, I))


class LatentMoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, E, I = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        X = cfg.routed_expert_hidden_size or H
        self.cfg, self.E, self.k, self.X = cfg, E, cfg.num_experts_per_token, X
        self.gate = Router(H, E)
        self.experts = Experts(E, X, I)
        if cfg.num_shared_experts:
            self.shared_experts = MLP(cfg, H, I * cfg.num_shared_experts)
        if cfg.routed_expert_hidden_size:
            self.routed_expert_down_proj = _lin(H, X)
            if cfg.latent_moe_use_norm:
                self.routed_expert_norm = RMSNorm(X, cfg.rms_norm_eps)
            self.routed_expert_up_proj = _lin(X, H)
        self.qat = False
        self.last_counts = None      # [E] token-slot counts of the last forward (for the bias update)
        self.aux_loss = None         # sequence-level balance loss of the last forward (training only)

    def forward(self, x):
        cfg = self.cfg
        B, T, H = x.shape
        xf = x.reshape(B * T, H)
        n = xf.shape[0]
        with _no_autocast(x.device.type):
            s = torch.sigmoid(F.linear(xf.to(ACC[0]), self.gate.weight.to(ACC[0])))              # [n,E] fp32
            sel = torch.topk(s.detach() + self.gate.e_score_correction_bias, self.k, dim=-1).indices  # [n,k]
            w = torch.gather(s, 1, sel)
            if cfg.moe_renormalize:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            w = w * cfg.routed_scaling_factor
        flat = sel.reshape(-1)                                                          # [n*k]
        counts = torch.bincount(flat, minlength=self.E)
        self.last_counts = counts.detach()
        if self.training:
            # sequence-level balance loss (DeepSeek-V3 L_Bal): sum_e f_e P_e per sequence, averaged
            sn = s / (s.sum(-1, keepdim=True) + 1e-20)
            P = sn.reshape(B, T, self.E).mean(1)                                           # [B,E]
            oh = torch.zeros(B, T * self.k, self.E, device=x.device, dtype=s.dtype).scatter_(
                2, sel.reshape(B, T * self.k, 1), 1.0)
            f = oh.sum(1) * (self.E / (self.k * T))
            self.aux_loss = (f.detach() * P).sum(-1).mean()
        xin = self.routed_expert_down_proj(xf) if cfg.routed_expert_hidden_size else xf
        # sort the (token, slot) pairs by expert; run all experts as batched matmuls over [E, cap, X]
        order = torch.argsort(flat)
        tok = order // self.k
        start = torch.cumsum(counts, 0) - counts
        pos = torch.arange(n * self.k, device=x.device) - start[flat[order]]
        cap = int(counts.max().item())
        dest = flat[order] * cap + pos
        buf = xin.new_zeros(self.E * cap, xin.shape[-1])
        buf[dest] = xin[tok]
        buf = buf.reshape(self.E, cap, -1)
        w1, w3, w2 = self.experts.w1, self.experts.w3, self.experts.w2
        if self.qat:
            w1, w3, w2 = mxfp4_ste(w1), mxfp4_ste(w3), mxfp4_ste(w2)
        dt = buf.dtype
        hmid = glu(cfg, torch.bmm(buf, w1.transpose(1, 2).to(dt)), torch.bmm(buf, w3.transpose(1, 2).to(dt)))
        y = torch.bmm(hmid.to(dt), w2.transpose(1, 2).to(dt)).reshape(self.E * cap, -1)
        yw = y[dest].to(ACC[0]) * w.reshape(-1)[order].unsqueeze(-1)
        u = torch.zeros(n, yw.shape[-1], device=x.device, dtype=yw.dtype).index_add_(0, tok, yw)
        if cfg.routed_expert_hidden_size:
            if cfg.latent_moe_use_norm:
                u = self.routed_expert_norm(u)
            u = self.routed_expert_up_proj(u)
        if cfg.num_shared_experts:
            u = u + self.shared_experts(xf)
        return u.reshape(B, T, -1)


class Layer(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.i = i
        self.input_layernorm = RMSNorm(H, eps)
        self.post_attention_layernorm = RMSNorm(H, eps)
        if cfg.attn_res_block_size:
            self.self_attention_res_norm = RMSNorm(H, eps)
            self.self_attention_res_proj = _lin(H, 1)
            self.mlp_res_norm = RMSNorm(H, eps)
            self.mlp_res_proj = _lin(H, 1)
        self.self_attn = KDA(cfg) if cfg.is_kda(i) else MLA(cfg)
        if cfg.is_moe(i):
            self.block_sparse_moe = LatentMoE(cfg)
        else:
            self.mlp = MLP(cfg, H, cfg.intermediate_size)

    def ffn(self, x):
        return self.block_sparse_moe(x) if hasattr(self, "block_sparse_moe") else self.mlp(x)


def attn_res(srcs: List[torch.Tensor], norm: RMSNorm, proj: nn.Linear, eps: float):
    """Block Attention Residual (spec 3.1): softmax over sources of RMSNorm_noweight(v_i) . (norm.w * proj.w)."""
    w = norm.weight.to(ACC[0]) * proj.weight.to(ACC[0]).reshape(-1)
    V = torch.stack([s.to(ACC[0]) for s in srcs], 0)                         # [N,B,T,H]
    score = (rms_norm(V, None, eps) * w).sum(-1)
    p = torch.softmax(score, 0)
    return (p.unsqueeze(-1) * V).sum(0)


class K3Tiny(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if not cfg.attn_res_block_size:
            raise ValueError("k3tiny trains K3: attn_res_block_size required")
        self.cfg = cfg
        H, V = cfg.hidden_size, cfg.vocab_size
        self.embed_tokens = nn.Embedding(V, H)
        self.layers = nn.ModuleList([Layer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.output_attn_res_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.output_attn_res_proj = _lin(H, 1)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = _lin(H, V)
        self.reset_parameters()

    # -- init (documented in docs/k3-tiny-training.md)
    @torch.no_grad()
    def reset_parameters(self, seed: Optional[int] = None):
        cfg = self.cfg
        gen = torch.Generator().manual_seed(seed if seed is not None else 0)
        L = cfg.num_hidden_layers
        out_scale = 1.0 / math.sqrt(2 * L)

        def normal_(p, std):
            p.copy_(torch.randn(p.shape, generator=gen) * std)

        out_names = ("o_proj", "down_proj", "routed_expert_up_proj")
        for name, p in self.named_parameters():
            leaf = name.split(".")[-2] if name.endswith(".weight") else name.split(".")[-1]
            if name.endswith("_norm.weight") or name.endswith("layernorm.weight") or name == "norm.weight" \
                    or name.endswith("o_norm.weight"):
                p.fill_(1.0)
            elif name.endswith("_res_proj.weight"):
                p.zero_()                              # AttnRes starts as a uniform average of its sources
            elif name == "embed_tokens.weight":
                normal_(p, 1.0)
            elif "conv1d" in name:
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) / math.sqrt(p.shape[-1]))
            elif name.endswith("dt_bias"):
                # g = -5 sigmoid(z): z ~ U(-7, -1.5) spreads per-step decays exp(g) over ~[0.995, 0.35]
                p.copy_(torch.rand(p.shape, generator=gen) * 5.5 - 7.0)
            elif name.endswith("A_log"):
                p.zero_()
            elif name.endswith("experts.w1") or name.endswith("experts.w3"):
                normal_(p, 1.0 / math.sqrt(p.shape[-1]))
            elif name.endswith("experts.w2"):
                normal_(p, out_scale / math.sqrt(p.shape[-1]))
            elif name.endswith("gate.weight"):
                normal_(p, 1.0 / math.sqrt(p.shape[-1]))
            elif name.endswith("f_b_proj.weight"):
                normal_(p, 0.1 / math.sqrt(p.shape[-1]))
            elif p.dim() == 2:
                std = 1.0 / math.sqrt(p.shape[-1])
                if leaf in out_names:
                    std *= out_scale
                normal_(p, std)
            else:
                raise RuntimeError(f"no init rule for {name}")
        for m in self.modules():
            if isinstance(m, LatentMoE):
                m.gate.e_score_correction_bias.zero_()

    def moe_layers(self) -> List[LatentMoE]:
        return [l.block_sparse_moe for l in self.layers if hasattr(l, "block_sparse_moe")]

    def set_qat(self, on: bool):
        for m in self.moe_layers():
            m.qat = on

    def forward(self, ids, taps: Optional[Dict[int, object]] = None, head: bool = True):
        """ids [B, T] -> logits [B, T, V] (None with head=False). taps: optional dict whose keys are tap ids
        (docs/block-drafter.md); each key present is set to [B, T, H]: for l < num_layers the normed mixer
        input of layer l, for l == num_layers the final-normed hidden. Observation only."""
        cfg = self.cfg
        eps = cfg.rms_norm_eps
        bs = cfg.attn_res_block_size
        Bl: List[torch.Tensor] = []
        ACC[0] = torch.float64 if self.embed_tokens.weight.dtype == torch.float64 else torch.float32
        P = self.embed_tokens(ids).to(ACC[0])
        for l, layer in enumerate(self.layers):
            h = attn_res(Bl + [P], layer.self_attention_res_norm, layer.self_attention_res_proj, eps) if Bl else P
            if l % bs == 0:
                Bl.append(P)
                P = None
            xin = layer.input_layernorm(h)
            if taps is not None and l in taps:
                taps[l] = xin
            a = layer.self_attn(xin).to(ACC[0])
            P = a if P is None else P + a
            h2 = attn_res(Bl + [P], layer.mlp_res_norm, layer.mlp_res_proj, eps)
            P = P + layer.ffn(layer.post_attention_layernorm(h2)).to(ACC[0])
        h = attn_res(Bl + [P], self.output_attn_res_norm, self.output_attn_res_proj, eps)
        hn = self.norm(h)
        if taps is not None and len(self.layers) in taps:
            taps[len(self.layers)] = hn
        return self.lm_head(hn) if head else None

    def aux_loss(self):
        ls = [m.aux_loss for m in self.moe_layers() if m.aux_loss is not None]
        return sum(ls) / len(ls) if ls else None

    @torch.no_grad()
    def update_router_bias(self, u: float):
        """Auxiliary-loss-free balancing (DeepSeek-V3): bias_e += u * sign(mean_load - load_e)."""
        for m in self.moe_layers():
            if m.last_counts is None:
                continue
            c = m.last_counts.to(ACC[0])
            m.gate.e_score_correction_bias.add_(u * torch.sign(c.mean() - c))

    # -- HF mapping
    def hf_tensors(self) -> Dict[str, torch.Tensor]:
        """name -> fp32 CPU tensor in the HF K3 schema (experts unstacked to experts.{e}.wN.weight)."""
        pre = "language_model.model."
        out: Dict[str, torch.Tensor] = {}
        sd = self.state_dict()
        for name, t in sd.items():
            t = t.detach().float().cpu()
            if name == "lm_head.weight":
                out["language_model.lm_head.weight"] = t
            elif ".experts.w" in name:
                base, wn = name.rsplit(".", 1)
                for e in range(t.shape[0]):
                    out[f"{pre}{base}.{e}.{wn}.weight"] = t[e].contiguous()
            else:
                out[pre + name] = t
        return out

    def load_hf_tensors(self, tens: Dict[str, torch.Tensor]):
        """Inverse of hf_tensors (float tensors)."""
        pre = "language_model.model."
        sd = self.state_dict()
        new = {}
        for name, t in sd.items():
            if name == "lm_head.weight":
                new[name] = tens["language_model.lm_head.weight"]
            elif ".experts.w" in name:
                base, wn = name.rsplit(".", 1)
                new[name] = torch.stack([tens[f"{pre}{base}.{e}.{wn}.weight"] for e in range(t.shape[0])])
            else:
                new[name] = tens[pre + name].reshape(t.shape)
        self.load_state_dict({k: v.to(sd[k].dtype) for k, v in new.items()})


def count_params(model: K3Tiny) -> dict:
    cfg = model.cfg
    tot = sum(p.numel() for p in model.parameters())
    routed = sum(m.experts.w1.numel() + m.experts.w2.numel() + m.experts.w3.numel() for m in model.moe_layers())
    emb = model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    active = tot - routed + routed * cfg.num_experts_per_token // cfg.num_experts
    return {"total": tot, "routed_experts": routed, "non_expert": tot - routed, "embed_and_head": emb,
            "active": active, "active_non_embedding": active - emb}
