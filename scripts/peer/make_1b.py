"""k3-1b: the ~1.5B K3-architecture gate checkpoint (the lead's /work/gate/make_1b.py; low-rank KDA gate).
usage: make_1b.py [OUT=/work/gate/k3-1b]  (then make_tok32k.py for its tokenizer)"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from collections import OrderedDict
from k3ref.checkpoint import tiny_k3_config, write_checkpoint
cfg = tiny_k3_config()
t = cfg["text_config"]
V = 32768
t.update(vocab_size=V, hidden_size=2048, num_hidden_layers=10, num_attention_heads=16, intermediate_size=5632,
         q_lora_rank=768, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
         num_experts=64, num_experts_per_token=8, num_shared_experts=1, moe_intermediate_size=768,
         routed_expert_hidden_size=1024, attn_res_block_size=4, bos_token_id=V-256, eos_token_id=V-254, pad_token_id=V-1)
t["linear_attn_config"] = OrderedDict(kda_layers=[1,2,3,5,6,7,9], full_attn_layers=[4,8,10], head_dim=128, num_heads=16,
                                      short_conv_kernel_size=4, gate_lower_bound=-5.0, use_full_rank_gate=False)
cfg.update(bos_token_id=V-256, eos_token_id=V-254, pad_token_id=V-1)
write_checkpoint(sys.argv[1] if len(sys.argv) > 1 else "/work/gate/k3-1b", cfg, seed=11, num_shards=2)
print("ok")
