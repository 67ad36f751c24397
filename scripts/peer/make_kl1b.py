"""kl-1b: a ~1.7B Kimi-Linear-architecture checkpoint (model_type kimi_linear, the schema of
Kimi-Linear-48B-A3B's config.json: no q_lora, low-rank KDA gate g_a/g_b, no gate_lower_bound, silu, MoE in the
hidden width, routed_scaling 2.446), sized like k3-1b: hidden 2048, 10 layers (KDA 16x128; MLA 16 heads at
layers 4/8/10), 64 experts top-8 of width 384 (same routed-expert bytes per layer as k3-1b's 768 x 1024 latent),
routed experts MXFP4 (compressed-tensors, as k3-1b; the real Kimi-Linear ships them BF16), BF16 elsewhere.
usage: make_kl1b.py [OUT_DIR=/work/gate/kl-1b]"""
import os, subprocess, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from collections import OrderedDict
from k3ref.checkpoint import QUANT_CONFIG, write_checkpoint

OUT = sys.argv[1] if len(sys.argv) > 1 else "/work/gate/kl-1b"
V = 32768
cfg = OrderedDict(
    model_type="kimi_linear", architectures=["KimiLinearForCausalLM"],
    vocab_size=V, hidden_size=2048, num_hidden_layers=10, num_attention_heads=16, num_key_value_heads=16,
    intermediate_size=5632, rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=4096,
    hidden_act="silu", q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, mla_use_nope=True,
    linear_attn_config=OrderedDict(kda_layers=[1, 2, 3, 5, 6, 7, 9], full_attn_layers=[4, 8, 10], head_dim=128,
                                   num_heads=16, short_conv_kernel_size=4),
    num_experts=64, num_experts_per_token=8, num_shared_experts=1, moe_intermediate_size=384,
    moe_renormalize=True, moe_router_activation_func="sigmoid", routed_scaling_factor=2.446,
    use_grouped_topk=True, num_expert_group=1, topk_group=1, first_k_dense_replace=1, moe_layer_freq=1,
    num_nextn_predict_layers=0, torch_dtype="bfloat16", use_cache=True,
    bos_token_id=V - 256, eos_token_id=V - 255, pad_token_id=V - 1,
    quantization_config=QUANT_CONFIG,
)
write_checkpoint(OUT, cfg, seed=12, num_shards=2)
subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_tok32k.py"),
                os.path.join(os.environ.get("K3_SHARED_DIR", "/work/shared"), "data", "tokenizers", "kimi", "tiktoken.model"), OUT], check=True)
print("ok")
