// The absorbed MLA form's two projections through kv_b (model-spec 3.3), one (token, head) at a time:
//   absorb_q: q_lat[0:kr] = sum_{d < dn} q[d] kv_b[h (dn + dv) + d][:],   q_lat[kr:kr+dr] = q[dn:dn+dr]
//   up_v:     o[d] = kv_b[h (dn + dv) + dn + d][:] . o_lat,              d < dv
// kv_b [nh (dn + dv)][kr] is read as stored: the checkpoint's bf16 (half the bytes of the fp32 copy; at
// batch 1 each MLA layer streams all of it) or fp32. bf16 widens exactly, and both storages run the same
// 8-lane FMA sequence, so they give the same bits (MlaAbsorb.Bf16AndF32StorageAgreeBitForBit). The order of each
// output's operations is part of the contract (MlaAbsorb.EachOutputsOperationsInTheirStatedOrder): absorb_q's q_lat[j]
// is one FMA chain over d ascending from 0; up_v's o[d] two 8-lane accumulators over 16-column steps (lanes j % 16 < 8
// and >= 8), an 8-column step into the first, their sum, lanes (l, l + 4) then (0 + 2, 1 + 3) then the two added, then
// a scalar FMA tail.
//
// A GGUF whose kv_b halves are quantised (llama-quantize's Q4_K_M: attn_k_b Q5_0, attn_v_b Q4_K) is read as stored
// (k_b, v_b): 3-4x fewer bytes than the fp32 copy the loader rebuilds. A few KB of rows at a time are decoded exactly
// (the format's dequant: the values of that fp32 copy) into L1, and each output is then that row's dot with the
// input -- absorb_q's q_lat[j] with attn_k_b's row j (kv_lora column j of head h's key rows, stored transposed), up_v's
// o[d] with attn_v_b's row d -- as ONE 8-lane FMA accumulator over 8-column steps whose lanes are summed ((l0 + l1) +
// (l2 + l3)) + ((l4 + l5) + (l6 + l7)). The same products as the fp32 copy's, in another order, so not its bits
// (MlaAbsorbStored.*).
#pragma once
#include <cstdint>

#include "k3/core/weight.h"

namespace k3::cpu {

struct KvB {
  const float* f32 = nullptr;     // one of the two is set
  const uint16_t* bf16 = nullptr;
  int64_t nope = 0, value = 0, rank = 0;
  // A GGUF's halves as stored, both set or neither (then used instead of the above): k_b [heads * rank][nope] (per
  // head the key rows transposed), v_b [heads * value][rank], in GGUF block formats (whole blocks per row).
  const WeightMatrix* k_b = nullptr;
  const WeightMatrix* v_b = nullptr;
};

void mla_absorb_q_head(const KvB& kvb, int64_t h, int64_t rope, const float* q, float* q_lat);
void mla_up_v_head(const KvB& kvb, int64_t h, const float* o_lat, float* o);
// The same for n tokens through head h (token t's rows of this head at q[t] / q_lat[t], o_lat[t] / o[t]): each token
// gets the single call's bits; stored halves are decoded once for all n (a batched decode step's MLA layer).
void mla_absorb_q_head_n(const KvB& kvb, int64_t h, int64_t rope, int64_t n, const float* const* q, float* const* q_lat);
void mla_up_v_head_n(const KvB& kvb, int64_t h, int64_t n, const float* const* o_lat, float* const* o);

}  // namespace k3::cpu
