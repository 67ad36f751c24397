"""Reference forward pass of Kimi K3 (text) and Kimi-Linear, model-spec.md section 3.

Everything runs in one float dtype (float32 or float64) chosen at construction; BF16 / MXFP4 weights are
expanded exactly into that dtype. The model is stateful per sequence through `State`:
  - KDA layers: recurrent state S [Hk, Dk, Dv] and the short-conv states (last K-1 inputs) of q, k, v [C, K-1]
  - MLA layers: latent cache [S, kv_lora_rank + qk_rope_head_dim] = [c_kv (after kv_a_layernorm) | k_pe]
`Model.forward(tokens, state, kda_mode, mla_mode)` appends len(tokens) tokens to the sequence:
  kda_mode "chunk" (chunked WY form, chunk_size tokens) or "recurrent" (token by token);
  mla_mode "mha" (decompressed keys/values) or "absorbed" (attention over the latent cache).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from .config import K3Config
from . import mxfp4
from .safetensors_io import BF16Array


# ----------------------------------------------------------------------------------------------- helpers
def rms_norm(x: torch.Tensor, w: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def glu(cfg: K3Config, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    if cfg.hidden_act == "silu":
        return torch.nn.functional.silu(g) * u
    b, lb = cfg.activation_situ_beta, cfg.activation_situ_linear_beta
    return b * torch.tanh(g / b) * torch.sigmoid(g) * (lb * torch.tanh(u / lb))


# ----------------------------------------------------------------------------------------------- KDA cores
def kda_recurrent(q, k, v, g, beta, S):
    """q,k,v,g: [T,H,D]; beta [T,H]; S [H,Dk,Dv] (state before token 0). Returns (o [T,H,Dv], S_out).
    q must already be L2-normalised and scaled by 1/sqrt(D); k L2-normalised; g <= 0 log-decays."""
    S = S.clone()
    outs = []
    for t in range(q.shape[0]):
        S = torch.exp(g[t])[:, :, None] * S                      # decay rows (key channels)
        kv = torch.einsum("hk,hkv->hv", k[t], S)                  # S'^T k
        u = beta[t][:, None] * (v[t] - kv)
        S = S + k[t][:, :, None] * u[:, None, :]
        outs.append(torch.einsum("hk,hkv->hv", q[t], S))
    return torch.stack(outs, 0), S


def kda_chunked(q, k, v, g, beta, S, chunk: int = 64):
    """Chunked (WY / UT transform) form of kda_recurrent; same arguments and results."""
    T, H, D = q.shape
    S = S.clone()
    outs = []
    for s0 in range(0, T, chunk):
        s1 = min(T, s0 + chunk)
        n = s1 - s0
        Q = q[s0:s1].transpose(0, 1)            # [H,n,Dk]
        K = k[s0:s1].transpose(0, 1)
        V = v[s0:s1].transpose(0, 1)            # [H,n,Dv]
        B = beta[s0:s1].transpose(0, 1)         # [H,n]
        G = torch.cumsum(g[s0:s1].transpose(0, 1), dim=1)    # [H,n,Dk] cumulative log decay
        diff = G[:, :, None, :] - G[:, None, :, :]            # [H,i,j,D] = G_i - G_j
        incl = torch.tril(torch.ones(n, n, dtype=torch.bool))
        strict = torch.tril(torch.ones(n, n, dtype=torch.bool), -1)
        E = torch.exp(diff.masked_fill(~incl[None, :, :, None], -math.inf))
        A_kk = torch.einsum("hid,hjd,hijd->hij", K, K, E) * B[:, :, None]
        A_kk = A_kk * strict
        eye = torch.eye(n, dtype=q.dtype)
        Tm = torch.linalg.solve(eye + A_kk, torch.diag_embed(B))   # (I + A_kk)^-1 diag(beta)
        eG = torch.exp(G)
        W = Tm @ (eG * K)
        U = Tm @ V
        Vt = U - W @ S
        A_qk = torch.einsum("hid,hjd,hijd->hij", Q, K, E) * incl
        O = (Q * eG) @ S + A_qk @ Vt
        GC = G[:, -1:, :]                                         # [H,1,D]
        S = torch.exp(GC)[:, 0, :, None] * S + (torch.exp(GC - G) * K).transpose(1, 2) @ Vt
        outs.append(O.transpose(0, 1))
    return torch.cat(outs, 0), S


def short_conv(x, w, cstate):
    """Causal depthwise conv (no bias) + SiLU. x [T,C], w [C,W] (tap W-1 = current token), cstate [C,W-1]
    (previous inputs, oldest first). Returns (y [T,C], new cstate)."""
    Wk = w.shape[1]
    xx = torch.cat([cstate.transpose(0, 1), x], 0)    # [T+W-1, C]
    T = x.shape[0]
    y = sum(xx[j:j + T] * w[:, j] for j in range(Wk))
    return torch.nn.functional.silu(y), xx[T:].transpose(0, 1).clone()


# ----------------------------------------------------------------------------------------------- MLA cores
def mla_mha(q, c_all, kpe_all, w_kvb, nope, vdim, P, scale):
    """q [T,nh,nope+rope]; c_all [S,r]; kpe_all [S,rope]; w_kvb [nh*(nope+v), r]. Queries at positions P..P+T-1."""
    T, nh, _ = q.shape
    S = c_all.shape[0]
    kv = (c_all @ w_kvb.T).view(S, nh, nope + vdim)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    sc = torch.einsum("thn,shn->hts", q[..., :nope], k_nope) + torch.einsum("thr,sr->hts", q[..., nope:], kpe_all)
    sc = sc * scale
    mask = torch.arange(S)[None, :] > (P + torch.arange(T))[:, None]
    sc = sc.masked_fill(mask[None], -math.inf)
    p = torch.softmax(sc, -1)
    return torch.einsum("hts,shv->thv", p, v)


def mla_absorbed(q, c_all, kpe_all, w_kvb, nope, vdim, P, scale):
    T, nh, _ = q.shape
    S, r = c_all.shape
    wk = w_kvb.view(nh, nope + vdim, r)
    W_UK, W_UV = wk[:, :nope, :], wk[:, nope:, :]
    q_lat = torch.einsum("thn,hnr->thr", q[..., :nope], W_UK)
    sc = torch.einsum("thr,sr->hts", q_lat, c_all) + torch.einsum("thr,sr->hts", q[..., nope:], kpe_all)
    sc = sc * scale
    mask = torch.arange(S)[None, :] > (P + torch.arange(T))[:, None]
    sc = sc.masked_fill(mask[None], -math.inf)
    p = torch.softmax(sc, -1)
    o_lat = torch.einsum("hts,sr->thr", p, c_all)
    return torch.einsum("thr,hvr->thv", o_lat, W_UV)


# ----------------------------------------------------------------------------------------------- state
@dataclass
class State:
    pos: int = 0
    kda: Dict[int, dict] = field(default_factory=dict)    # layer -> {"S", "conv_q", "conv_k", "conv_v"}
    mla: Dict[int, torch.Tensor] = field(default_factory=dict)   # layer -> cache [S, r + rope]

    def clone(self) -> "State":
        return State(self.pos, {l: {k: v.clone() for k, v in d.items()} for l, d in self.kda.items()},
                     {l: c.clone() for l, c in self.mla.items()})


# ----------------------------------------------------------------------------------------------- model
class Model:
    def __init__(self, cfg: K3Config, tensors: Dict[str, object], dtype=torch.float64):
        self.cfg = cfg
        self.dtype = dtype
        self.w: Dict[str, torch.Tensor] = {}
        # MXFP4 pairs: X.weight_packed + X.weight_scale -> X.weight
        for name, t in tensors.items():
            if name.endswith(".weight_scale"):
                continue
            if name.endswith(".weight_packed"):
                base = name[: -len(".weight_packed")]
                sc = tensors.get(base + ".weight_scale")
                if sc is None:
                    raise KeyError(f"{name}: no matching .weight_scale")
                arr = mxfp4.dequantize(t, sc)
                self.w[base + ".weight"] = torch.from_numpy(arr).to(dtype)
                continue
            arr = t.to_f32() if isinstance(t, BF16Array) else np.asarray(t)
            self.w[name] = torch.from_numpy(arr.astype(np.float64)).to(dtype)
        self.stats = {"min_route_margin": math.inf}
        # eps of the MLA-internal norms (q_a_layernorm, kv_a_layernorm). Spec: rms_norm_eps. HF modeling code
        # constructs them with its RMSNorm default eps 1e-6 (docs/reference.md); set to 1e-6 to follow HF.
        self.mla_norm_eps = cfg.rms_norm_eps
        # HF's released Kimi-Linear modeling_kimi.py adds the correction bias in place to a view of the scores,
        # so its routing weights include the bias. Spec: the bias only selects (False).
        self.router_bias_in_weights = False

    # -- weights
    def W(self, name: str) -> torch.Tensor:
        full = self.cfg.head_name if name == "@head" else self.cfg.prefix + name
        if full not in self.w:
            raise KeyError(f"missing tensor {full}")
        return self.w[full]

    def lin(self, x, name):
        return x @ self.W(name + ".weight").T

    # -- state
    def new_state(self) -> State:
        cfg = self.cfg
        st = State()
        Hk, D, Kc = cfg.kda_num_heads, cfg.kda_head_dim, cfg.short_conv_kernel_size
        for i in range(cfg.num_hidden_layers):
            if cfg.is_kda(i):
                st.kda[i] = {"S": torch.zeros(Hk, D, D, dtype=self.dtype),
                             **{f"conv_{c}": torch.zeros(Hk * D, Kc - 1, dtype=self.dtype) for c in "qkv"}}
            else:
                st.mla[i] = torch.zeros(0, cfg.kv_lora_rank + cfg.qk_rope_head_dim, dtype=self.dtype)
        return st

    # -- layers
    def kda(self, i, x, st: State, mode: str, chunk: int):
        cfg = self.cfg
        p = f"layers.{i}.self_attn."
        T = x.shape[0]
        Hk, D = cfg.kda_num_heads, cfg.kda_head_dim
        ls = st.kda[i]
        qkv = {}
        for c in "qkv":
            pre = self.lin(x, p + f"{c}_proj")
            w = self.W(p + f"{c}_conv1d.weight")
            w = w.reshape(w.shape[0], w.shape[-1])
            qkv[c], ls[f"conv_{c}"] = short_conv(pre, w, ls[f"conv_{c}"])
        q, k, v = (qkv[c].view(T, Hk, D) for c in "qkv")
        z = (self.lin(self.lin(x, p + "f_a_proj"), p + "f_b_proj") + self.W(p + "dt_bias")).view(T, Hk, D)
        A = self.W(p + "A_log").reshape(-1)[:Hk].view(1, Hk, 1)
        if cfg.gate_lower_bound is not None:
            g = cfg.gate_lower_bound * torch.sigmoid(torch.exp(A) * z)
        else:
            g = -torch.exp(A) * torch.nn.functional.softplus(z)
        beta = torch.sigmoid(self.lin(x, p + "b_proj"))           # [T,Hk]
        q = l2_norm(q) / math.sqrt(D)
        k = l2_norm(k)
        if mode == "recurrent":
            o, ls["S"] = kda_recurrent(q, k, v, g, beta, ls["S"])
        elif mode == "chunk":
            o, ls["S"] = kda_chunked(q, k, v, g, beta, ls["S"], chunk)
        else:
            raise ValueError(mode)
        if cfg.use_full_rank_gate:
            gate = self.lin(x, p + "g_proj")
        else:
            gate = self.lin(self.lin(x, p + "g_a_proj"), p + "g_b_proj")
        y = rms_norm(o, self.W(p + "o_norm.weight"), cfg.rms_norm_eps) * torch.sigmoid(gate.view(T, Hk, D))
        return self.lin(y.reshape(T, Hk * D), p + "o_proj")

    def mla(self, i, x, st: State, mode: str):
        cfg = self.cfg
        p = f"layers.{i}.self_attn."
        T = x.shape[0]
        nh, nope, rope, vd, r = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                                 cfg.v_head_dim, cfg.kv_lora_rank)
        if cfg.q_lora_rank:
            q = self.lin(rms_norm(self.lin(x, p + "q_a_proj"), self.W(p + "q_a_layernorm.weight"), self.mla_norm_eps),
                         p + "q_b_proj")
        else:
            q = self.lin(x, p + "q_proj")
        q = q.view(T, nh, nope + rope)
        kv = self.lin(x, p + "kv_a_proj_with_mqa")
        c = rms_norm(kv[:, :r], self.W(p + "kv_a_layernorm.weight"), self.mla_norm_eps)
        P = st.mla[i].shape[0]
        st.mla[i] = torch.cat([st.mla[i], torch.cat([c, kv[:, r:]], 1)], 0)
        cache = st.mla[i]
        scale = 1.0 / math.sqrt(nope + rope)
        fn = {"mha": mla_mha, "absorbed": mla_absorbed}[mode]
        o = fn(q, cache[:, :r], cache[:, r:], self.W(p + "kv_b_proj.weight"), nope, vd, P, scale).reshape(T, nh * vd)
        if cfg.mla_use_output_gate:
            o = o * torch.sigmoid(self.lin(x, p + "g_proj"))
        return self.lin(o, p + "o_proj")

    def mlp(self, x, p):
        return self.lin(glu(self.cfg, self.lin(x, p + "gate_proj"), self.lin(x, p + "up_proj")), p + "down_proj")

    def expert(self, x, p):
        return self.lin(glu(self.cfg, self.lin(x, p + "w1"), self.lin(x, p + "w3")), p + "w2")

    def moe(self, i, x):
        cfg = self.cfg
        p = f"layers.{i}.block_sparse_moe."
        T = x.shape[0]
        if cfg.moe_router_activation_func != "sigmoid":
            raise ValueError(cfg.moe_router_activation_func)
        s = torch.sigmoid(self.lin(x, p + "gate"))                       # [T,E]
        sel_score = s + self.W(p + "gate.e_score_correction_bias")
        kk = cfg.num_experts_per_token
        top = torch.topk(sel_score, kk + 1 if kk < cfg.num_experts else kk, dim=-1)
        if kk < cfg.num_experts:
            margin = (top.values[:, kk - 1] - top.values[:, kk]).min().item()
            self.stats["min_route_margin"] = min(self.stats["min_route_margin"], margin)
        idx = top.indices[:, :kk]
        sw = torch.gather(sel_score if self.router_bias_in_weights else s, 1, idx)
        if cfg.moe_renormalize:
            sw = sw / (sw.sum(-1, keepdim=True) + 1e-20)
        sw = sw * cfg.routed_scaling_factor
        xin = self.lin(x, p + "routed_expert_down_proj") if cfg.routed_expert_hidden_size else x
        u = torch.zeros_like(xin)
        for e in range(cfg.num_experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            u[rows] += sw[rows, slot][:, None] * self.expert(xin[rows], p + f"experts.{e}.")
        if cfg.routed_expert_hidden_size:
            if cfg.latent_moe_use_norm:
                u = rms_norm(u, self.W(p + "routed_expert_norm.weight"), cfg.rms_norm_eps)
            u = self.lin(u, p + "routed_expert_up_proj")
        if cfg.num_shared_experts:
            u = u + self.mlp(x, p + "shared_experts.")
        return u

    def ffn(self, i, x):
        return self.moe(i, x) if self.cfg.is_moe(i) else self.mlp(x, f"layers.{i}.mlp.")

    def attn(self, i, x, st, kda_mode, mla_mode, chunk):
        return self.kda(i, x, st, kda_mode, chunk) if self.cfg.is_kda(i) else self.mla(i, x, st, mla_mode)

    def attn_res(self, srcs: List[torch.Tensor], name: str):
        cfg = self.cfg
        V = torch.stack(srcs, 0)                                          # [N,T,H]
        w = self.W(name + "_norm.weight") * self.W(name + "_proj.weight").reshape(-1)
        score = (rms_norm(V, None, cfg.rms_norm_eps) * w).sum(-1)        # [N,T]
        pr = torch.softmax(score, 0)
        return (pr[..., None] * V).sum(0)

    # -- forward
    def forward(self, tokens, state: Optional[State] = None, kda_mode: str = "chunk", mla_mode: str = "mha",
                chunk: int = 64, return_hidden: bool = False, taps: Optional[Dict[int, object]] = None):
        """taps: optional dict whose keys are tap ids (docs/block-drafter.md); each key present is set to
        [T, H]: for l < num_layers the normed mixer input `xin` of layer l, for l == num_layers the
        final-normed hidden (the lm_head input). Observation only: the numerics do not change."""
        cfg = self.cfg
        st = state if state is not None else self.new_state()
        ids = torch.as_tensor(list(tokens), dtype=torch.long)
        eps = cfg.rms_norm_eps
        x = self.W("embed_tokens.weight")[ids]
        L = cfg.num_hidden_layers
        if cfg.attn_res_block_size:
            bs = cfg.attn_res_block_size
            B: List[torch.Tensor] = []
            P = x
            for l in range(L):
                pl = f"layers.{l}."
                h = self.attn_res(B + [P], pl + "self_attention_res") if B else P
                if l % bs == 0:
                    B.append(P)
                    P = None
                xin = rms_norm(h, self.W(pl + "input_layernorm.weight"), eps)
                if taps is not None and l in taps:
                    taps[l] = xin
                a = self.attn(l, xin, st, kda_mode, mla_mode, chunk)
                P = a if P is None else P + a
                h2 = self.attn_res(B + [P], pl + "mlp_res")
                m = self.ffn(l, rms_norm(h2, self.W(pl + "post_attention_layernorm.weight"), eps))
                P = P + m
            h = self.attn_res(B + [P], "output_attn_res")
        else:
            h = x
            for l in range(L):
                pl = f"layers.{l}."
                xin = rms_norm(h, self.W(pl + "input_layernorm.weight"), eps)
                if taps is not None and l in taps:
                    taps[l] = xin
                h = h + self.attn(l, xin, st, kda_mode, mla_mode, chunk)
                h = h + self.ffn(l, rms_norm(h, self.W(pl + "post_attention_layernorm.weight"), eps))
        hn = rms_norm(h, self.W("norm.weight"), eps)
        if taps is not None and L in taps:
            taps[L] = hn
        head = self.W("embed_tokens.weight") if cfg.tie_word_embeddings else self.w[cfg.head_name]
        logits = hn @ head.T
        st.pos += len(ids)
        return (logits, h) if return_hidden else logits


def load_model(dirpath: str, dtype=torch.float64) -> Model:
    from .config import load_config
    from .safetensors_io import load_dir
    return Model(load_config(dirpath), load_dir(dirpath), dtype)
