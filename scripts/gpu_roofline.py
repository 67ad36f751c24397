#!/usr/bin/env python3
"""Memory-bandwidth roofline of one forward step of a Kimi K3 / Kimi-Linear config, next to measured
`k3 bench offline` results. A decode step of batch B must read every non-routed weight once, the routed
experts that the B*K picks touch (expected distinct experts E*(1-(1-K/E)^B) per layer, uniform routing),
each sequence's KDA state (read + write) and MLA latent rows; the floor is bytes / bandwidth.
Prefill of T tokens is compute-bound: 2 * active params * T FLOPs at the bf16 tensor-core rate.

usage: gpu_roofline.py CONFIG_JSON [--num-layers N] [--bench RESULTS_JSON] [--bw GBPS] [--tflops T]"""
import argparse
import json


def load_cfg(path, num_layers):
    j = json.load(open(path))
    t = j.get("text_config", j)
    L = t["num_hidden_layers"]
    lac = t["linear_attn_config"]
    kda = set(lac["kda_layers"])
    if num_layers:
        L = min(L, num_layers)
    c = dict(t)
    c["L"] = L
    c["is_kda"] = [(i + 1) in kda for i in range(L)]
    c["Hk"], c["D"], c["W"] = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    c["full_gate"] = bool(lac.get("use_full_rank_gate"))
    c["mxfp4"] = "quantization_config" in t
    return c


def weights(c):
    """(non-routed bytes, per-expert bytes, active params per token) of the model."""
    H, V, L = c["hidden_size"], c["vocab_size"], c["L"]
    Hk, D, W = c["Hk"], c["D"], c["W"]
    C = Hk * D
    nh, dn, dr, dv, kr = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    ql = c.get("q_lora_rank") or 0
    E, K, I = c["num_experts"], c["num_experts_per_token"], c["moe_intermediate_size"]
    X = c.get("routed_expert_hidden_size") or H
    S = c.get("num_shared_experts", 0)
    dense_I = c["intermediate_size"]
    fk = c.get("first_k_dense_replace", 1)
    b = 2  # bf16
    nonrouted = V * H * b  # lm_head (embedding: only B rows)
    active = V * H
    for l in range(L):
        if c["is_kda"][l]:
            p = 3 * C * H + D * H + C * D + Hk * H + (C * H if c["full_gate"] else D * H + C * D) + H * C
            nonrouted += p * b + 3 * C * W * 4
            active += p
        else:
            q = (ql * H + nh * (dn + dr) * ql) if ql else nh * (dn + dr) * H
            p = q + (kr + dr) * H + nh * dv * H + (nh * dv * H if c.get("mla_use_output_gate") else 0)
            nonrouted += p * b + nh * (dn + dv) * kr * 4  # kv_b kept fp32
            active += p + nh * (dn + dv) * kr
        if l < fk:
            nonrouted += 3 * H * dense_I * b
            active += 3 * H * dense_I
        else:
            p = E * H + 3 * H * I * S + (2 * H * X if X != H else 0)
            nonrouted += p * b
            active += p + K * 3 * X * I
    per_expert = 3 * X * I * (0.5 + 1 / 32 if c["mxfp4"] else 2)
    return nonrouted, per_expert, active


def step_bytes(c, B, ctx, row_bytes=4):
    nonrouted, per_expert, _ = weights(c)
    E, K = c["num_experts"], c["num_experts_per_token"]
    moe_layers = sum(1 for l in range(c["L"]) if l >= c.get("first_k_dense_replace", 1))
    touched = E * (1 - (1 - K / E) ** B)
    kda_layers = sum(c["is_kda"])
    state = c["Hk"] * c["D"] * c["D"] * 4 * 2 + 3 * c["Hk"] * c["D"] * (c["W"] - 1) * 4 * 2
    mla_layers = c["L"] - kda_layers
    cache = (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * row_bytes * ctx
    return nonrouted + moe_layers * touched * per_expert + B * (kda_layers * state + mla_layers * cache)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--num-layers", type=int, default=0)
    ap.add_argument("--bench")
    ap.add_argument("--bw", type=float, default=4800.0, help="GB/s (H200 datasheet 4800)")
    ap.add_argument("--cache-bytes", type=float, default=4.0,
                    help="bytes per MLA latent value: 4 (fp32 rows, k3's default), 2 (--kv-cache-dtype bf16)")
    ap.add_argument("--tflops", type=float, default=989.0, help="dense bf16 TFLOP/s (H100/H200 datasheet)")
    a = ap.parse_args()
    c = load_cfg(a.config, a.num_layers)
    nonrouted, per_expert, active = weights(c)
    print(f"config {a.config} layers {c['L']}: non-routed weights {nonrouted / 1e9:.2f} GB, "
          f"{per_expert / 1e6:.1f} MB per expert, {active / 1e9:.2f} B active params/token")
    rows = json.load(open(a.bench))["results"] if a.bench else []
    print("| test | depth | batch | measured tok/s | roofline tok/s | of roofline | bytes/step (GB) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        B = r["n_batch"]
        if r["n_gen"]:
            ctx = r["n_depth"] + r["n_gen"] / 2
            byts = step_bytes(c, B, ctx, a.cache_bytes)
            roof = B / (byts / (a.bw * 1e9))
            label, gb = f"tg{r['n_gen']}", f"{byts / 1e9:.2f}"
        else:
            T = r["n_prompt"] * B
            roof = T / (2 * active * T / (a.tflops * 1e12)) if T else 0
            label, gb = f"pp{r['n_prompt']} (compute)", "-"
        print(f"| {label} | {r['n_depth']} | {B} | {r['avg_ts']:.1f} | {roof:.0f} | {100 * r['avg_ts'] / roof:.1f}% | {gb} |")


if __name__ == "__main__":
    main()
