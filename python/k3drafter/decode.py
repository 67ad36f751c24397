"""Cached greedy decoding of python/k3tiny/model_train.K3Tiny, for the drafter's data generation only.

model_train has no cache (it trains on whole windows), and re-running the whole prefix for every new token
costs O(length) forwards per token. This runs the same layers with per-row state instead:
  KDA  the recurrent state S [B*Hk, D, D] and the short-conv tails (the last K-1 pre-conv inputs) of q, k, v
  MLA  the latent rows c (after kv_a_layernorm) and k_pe of every position, per row
Rows are ragged: a right-padded prefill marks its padding invalid, and there KDA gets g = 0 and beta = 0
(state unchanged), the conv tail is taken at each row's own end, and MLA keys past a row's position are
masked; a later token of row i goes to position len_i and overwrites the padding's latent rows.

The layer loop mirrors K3Tiny.forward (AttnRes, norms, FFN reused from the module); only the two mixers
are re-expressed with state. Checked against the full forward: tests/test_decode.py, and gen_data.py
reports the agreement of every generated token with the full forward's argmax.
"""
from __future__ import annotations

import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # python/

from k3tiny import model_train as mt  # noqa: E402


class Cache:
    def __init__(self, model, B: int, max_len: int, device):
        cfg = model.cfg
        self.kda, self.mla = {}, {}
        for l, layer in enumerate(model.layers):
            m = layer.self_attn
            if isinstance(m, mt.KDA):
                C = m.Hk * m.D
                self.kda[l] = {"S": torch.zeros(B * m.Hk, m.D, m.D, device=device),
                               **{c: torch.zeros(B, m.Kc - 1, C, device=device) for c in "qkv"}}
            else:
                self.mla[l] = {"c": torch.zeros(B, max_len, m.r, device=device),
                               "kpe": torch.zeros(B, max_len, m.rope, device=device)}
        self.max_len = max_len


def kda_step(m, x, valid, st):
    """KDA.forward with state: x [B,T,H], valid [B,T] (a prefix of each row), st the layer's cache."""
    B, T, _ = x.shape
    Hk, D, Kc = m.Hk, m.D, m.Kc
    n_valid = valid.sum(1)
    rows = torch.arange(B, device=x.device)[:, None]
    conv_out = {}
    for c, proj, conv in (("q", m.q_proj, m.q_conv1d), ("k", m.k_proj, m.k_conv1d), ("v", m.v_proj, m.v_conv1d)):
        full = torch.cat([st[c], proj(x)], 1)                              # [B, Kc-1+T, C]: tail, then inputs
        y = F.conv1d(full.transpose(1, 2), conv.weight.to(full.dtype), groups=full.shape[-1])   # [B, C, T]
        conv_out[c] = F.silu(y).transpose(1, 2)
        # the last Kc-1 inputs up to each row's last valid one (input t sits at index Kc-1+t of `full`)
        st[c] = full[rows, n_valid[:, None] + torch.arange(Kc - 1, device=x.device)[None, :]]
    z = m.f_b_proj(m.f_a_proj(x))
    braw = m.b_proj(x)
    gate = m.g_proj(x)
    acc = mt.ACC[0]
    z = z.to(acc) + m.dt_bias.to(acc)
    A = torch.exp(m.A_log.to(acc)[:Hk]).repeat_interleave(D)
    g = m.cfg.gate_lower_bound * torch.sigmoid(A * z)
    beta = torch.sigmoid(braw.to(acc))
    g = torch.where(valid[..., None], g, torch.zeros_like(g))             # padding: no decay ...
    beta = torch.where(valid[..., None], beta, torch.zeros_like(beta))    # ... and no write: S unchanged

    def heads(t):
        return t.to(acc).reshape(B, T, Hk, D).transpose(1, 2).reshape(B * Hk, T, D)
    qh = heads(conv_out["q"])
    qh = qh / torch.sqrt(qh.pow(2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(D)
    kh = heads(conv_out["k"])
    kh = kh / torch.sqrt(kh.pow(2).sum(-1, keepdim=True) + 1e-6)
    o, st["S"] = mt.kda_chunk(qh, kh, heads(conv_out["v"]), heads(g), beta.transpose(1, 2).reshape(B * Hk, T),
                              S0=st["S"])
    o = o.reshape(B, Hk, T, D).transpose(1, 2)
    y = m.o_norm(o) * torch.sigmoid(gate.to(acc).reshape(B, T, Hk, D))
    return m.o_proj(y.reshape(B, T, Hk * D))


def mla_step(m, x, pos, st):
    """MLA.forward with a latent cache: queries at positions pos_i + t attend to keys 0 .. pos_i + t."""
    B, T, _ = x.shape
    nh, nope, rope, vd, r = m.nh, m.nope, m.rope, m.vd, m.r
    q = m.q_b_proj(m.q_a_layernorm(m.q_a_proj(x))).reshape(B, T, nh, nope + rope).transpose(1, 2)
    kv = m.kv_a_proj_with_mqa(x)
    tpos = pos[:, None] + torch.arange(T, device=x.device)[None, :]       # [B, T]
    rows = torch.arange(B, device=x.device)[:, None]
    st["c"][rows, tpos] = m.kv_a_layernorm(kv[..., :r]).to(st["c"].dtype)
    st["kpe"][rows, tpos] = kv[..., r:].to(st["kpe"].dtype)
    S = int(tpos.max()) + 1
    kvb = m.kv_b_proj(st["c"][:, :S]).reshape(B, S, nh, nope + vd).transpose(1, 2)
    k_nope, v = kvb[..., :nope], kvb[..., nope:]
    k = torch.cat([k_nope, st["kpe"][:, :S].unsqueeze(1).expand(B, nh, S, rope).to(k_nope.dtype)], -1)
    mask = torch.arange(S, device=x.device)[None, None, :] <= tpos[:, :, None]   # [B, T, S]
    o = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask[:, None])
    o = o.transpose(1, 2).reshape(B, T, nh * vd) * torch.sigmoid(m.g_proj(x))
    return m.o_proj(o)


@torch.no_grad()
def run(model, ids, pos, valid, cache: Cache):
    """Appends ids [B, T] at per-row positions pos [B] -> the final-normed hidden [B, T, H] (float32)."""
    cfg = model.cfg
    eps, bs = cfg.rms_norm_eps, cfg.attn_res_block_size
    mt.ACC[0] = torch.float32
    Bl = []
    P = model.embed_tokens(ids).to(mt.ACC[0])
    for l, layer in enumerate(model.layers):
        h = mt.attn_res(Bl + [P], layer.self_attention_res_norm, layer.self_attention_res_proj, eps) if Bl else P
        if l % bs == 0:
            Bl.append(P)
            P = None
        xin = layer.input_layernorm(h)
        if l in cache.kda:
            a = kda_step(layer.self_attn, xin, valid, cache.kda[l])
        else:
            a = mla_step(layer.self_attn, xin, pos, cache.mla[l])
        a = a.to(mt.ACC[0])
        P = a if P is None else P + a
        h2 = mt.attn_res(Bl + [P], layer.mlp_res_norm, layer.mlp_res_proj, eps)
        P = P + layer.ffn(layer.post_attention_layernorm(h2)).to(mt.ACC[0])
    h = mt.attn_res(Bl + [P], model.output_attn_res_norm, model.output_attn_res_proj, eps)
    return model.norm(h)


@torch.no_grad()
def generate_cached(model, prompts, max_new: int, eos: int, pad: int, device):
    """Same contract as gen_data.generate: -> (ids [B, max_prompt + max_new], plen [B], end [B])."""
    B = len(prompts)
    plen = torch.tensor([len(p) for p in prompts], device=device)
    Pm = int(plen.max())
    ids = torch.full((B, Pm + max_new), pad, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p, dtype=torch.long)
    rows = torch.arange(B, device=device)
    cache = Cache(model, B, Pm + max_new, device)
    valid = torch.arange(Pm, device=device)[None, :] < plen[:, None]
    hn = run(model, ids[:, :Pm], torch.zeros(B, dtype=torch.long, device=device), valid, cache)
    nxt = model.lm_head(hn[rows, plen - 1]).argmax(-1)
    lens = plen.clone()
    done = torch.zeros(B, dtype=torch.bool, device=device)
    all_valid = torch.ones(B, 1, dtype=torch.bool, device=device)
    for s in range(max_new):
        live = ~done
        ids[rows[live], lens[live]] = nxt[live]
        done = done | (live & (nxt == eos))
        lens = torch.where(live, lens + 1, lens)
        if s == max_new - 1 or bool(done.all()):
            break
        # every row runs its last token (a finished row's state goes stale: it is never read again)
        hn = run(model, ids[rows, lens - 1][:, None], lens - 1, all_valid, cache)
        nxt = model.lm_head(hn[:, 0]).argmax(-1)
    return ids, plen, lens - 1
