#include "k3/dist/shard_weights.h"

#include <cstring>
#include <string>

#include "k3/core/error.h"

namespace k3::dist {

WeightMatrix row_slice(const WeightMatrix& m, Range rows) {
  if (m.empty()) return m;
  if (rows.first < 0 || rows.count < 0 || rows.end() > m.rows)
    throw Error("shard: rows [" + std::to_string(rows.first) + ", " + std::to_string(rows.end()) + ") of a matrix of " +
                std::to_string(m.rows));
  WeightMatrix s = m;
  s.data = m.row_data(rows.first);
  if (m.scales) s.scales = m.row_scales(rows.first);
  s.rows = rows.count;
  s.tiled = nullptr;  // a second copy in a backend's layout covers the whole matrix, not the slice
  return s;
}

namespace {

const uint8_t* copy_blocks(ShardedWeights& out, const uint8_t* src, int64_t rows, int64_t row_bytes, int64_t off, int64_t n) {
  auto buf = std::make_unique<uint8_t[]>(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(buf.get() + r * n, src + r * row_bytes + off, static_cast<size_t>(n));
  out.copied_bytes += rows * n;
  out.copies.push_back(std::move(buf));
  return out.copies.back().get();
}

}  // namespace

namespace {

// column_slice's copy, also of all the columns.
WeightMatrix copy_columns(const WeightMatrix& m, Range c, ShardedWeights& out, const std::string& what, int tp) {
  if (c.first < 0 || c.count < 0 || c.end() > m.cols)
    throw Error("shard: columns [" + std::to_string(c.first) + ", " + std::to_string(c.end()) + ") of " + what +
                " with " + std::to_string(m.cols));
  const WeightLayout L = m.layout();
  if (c.first % L.block_elems != 0 || c.count % L.block_elems != 0)
    throw Error("--tensor-parallel-size " + std::to_string(tp) + ": " + what + " columns [" + std::to_string(c.first) +
                ", " + std::to_string(c.end()) + ") split " + L.name + " blocks of " + std::to_string(L.block_elems) +
                " values" + (what.find("expert") != std::string::npos ? " (use --enable-expert-parallel)" : ""));
  const int64_t b0 = c.first / L.block_elems, nb = c.count / L.block_elems;
  WeightMatrix s = m;
  s.cols = c.count;
  s.tiled = nullptr;  // as row_slice
  s.data = copy_blocks(out, static_cast<const uint8_t*>(m.data), m.rows, row_data_bytes(m.format, m.cols),
                       b0 * L.block_bytes, nb * L.block_bytes);
  if (m.scales)
    s.scales = copy_blocks(out, m.scales, m.rows, row_scale_bytes(m.format, m.cols), b0 * L.scale_bytes, nb * L.scale_bytes);
  return s;
}

}  // namespace

WeightMatrix column_slice(const WeightMatrix& m, Range c, ShardedWeights& out, const std::string& what, int tp) {
  if (m.empty() || (c.first == 0 && c.count == m.cols)) return m;  // all of it: the view
  return copy_columns(m, c, out, what, tp);
}

WeightMatrix masked_column_slice(const WeightMatrix& m, Range c, Range keep, ShardedWeights& out, const std::string& what,
                                 int tp) {
  if (m.empty() || (keep.first == 0 && keep.count == c.count)) return column_slice(m, c, out, what, tp);
  const WeightLayout L = m.layout();
  if (L.block_elems != 1 || keep.first < 0 || keep.end() > c.count)
    throw Error("--tensor-parallel-size " + std::to_string(tp) + ": replicated heads need a float " + what + " (it is " +
                L.name + ")");
  WeightMatrix s = copy_columns(m, c, out, what, tp);
  auto* bytes = const_cast<uint8_t*>(static_cast<const uint8_t*>(s.data));  // our own copy
  const int64_t eb = L.block_bytes, row_bytes = s.cols * eb;
  for (int64_t r = 0; r < s.rows; ++r) {
    uint8_t* row = bytes + r * row_bytes;
    std::memset(row, 0, static_cast<size_t>(keep.first * eb));  // +0 in F32, F16 and BF16
    std::memset(row + keep.end() * eb, 0, static_cast<size_t>((s.cols - keep.end()) * eb));
  }
  return s;
}

namespace {

class Sharder {
 public:
  Sharder(const ShardPlan& p, ShardedWeights& out) : p_(p), out_(out) {}
  WeightMatrix cols(const WeightMatrix& m, Range c, const char* what) { return column_slice(m, c, out_, what, p_.size); }
  // o_proj of a head block: its channels, with a replicated head's share kept and the rest zeroed.
  WeightMatrix o_proj(const WeightMatrix& m, const HeadShard& h, int64_t width, const char* what) {
    return masked_column_slice(m, {h.heads.first * width, h.heads.count * width}, h.o_channels, out_, what, p_.size);
  }
  // Elements [first * per, end * per) of a vector: per = values per head / row.
  static WeightVector vec(const WeightVector& v, Range r, int64_t per) {
    if (v.empty()) return v;
    return std::vector<float>(v.begin() + r.first * per, v.begin() + r.end() * per);
  }
  GluMlp glu(const GluMlp& g, Range inter, const char* what) {
    if (g.gate.empty()) return g;
    return {row_slice(g.gate, inter), row_slice(g.up, inter), cols(g.down, inter, what)};
  }

 private:
  const ShardPlan& p_;
  ShardedWeights& out_;
};

void shard_kda(Sharder& s, const KdaWeights& f, const ModelConfig& c, const HeadShard& hs, KdaWeights& w) {
  const int64_t D = c.kda_head_dim, W = c.conv_kernel;
  const Range heads = hs.heads;
  const Range ch{heads.first * D, heads.count * D};
  w = f;  // f_a, g_a (low rank) and o_norm ([D]) are replicated
  for (auto [dst, src] : {std::pair{&w.q, &f.q}, {&w.k, &f.k}, {&w.v, &f.v}, {&w.f_b, &f.f_b}, {&w.g, &f.g}, {&w.g_b, &f.g_b}})
    *dst = row_slice(*src, ch);
  w.b = row_slice(f.b, heads);
  w.o = s.o_proj(f.o, hs, D, "KDA o_proj");
  w.q_conv = Sharder::vec(f.q_conv, ch, W);
  w.k_conv = Sharder::vec(f.k_conv, ch, W);
  w.v_conv = Sharder::vec(f.v_conv, ch, W);
  w.dt_bias = Sharder::vec(f.dt_bias, ch, 1);
  w.A_log = Sharder::vec(f.A_log, heads, 1);
  w.A_exp = Sharder::vec(f.A_exp, heads, 1);
}

void shard_mla(Sharder& s, const MlaWeights& f, const ModelConfig& c, const HeadShard& hs, MlaWeights& w) {
  const int64_t qk = c.mla_qk_dim(), dv = c.v_head_dim, kvb = c.qk_nope_dim + dv;
  const Range heads = hs.heads;
  w = f;  // q_a, kv_a and their norms are replicated: the latent (and so the MLA cache) is the same on every rank
  w.q_b = row_slice(f.q_b, {heads.first * qk, heads.count * qk});
  w.q = row_slice(f.q, {heads.first * qk, heads.count * qk});
  w.g = row_slice(f.g, {heads.first * dv, heads.count * dv});
  w.o = s.o_proj(f.o, hs, dv, "MLA o_proj");
  const Range kv_rows{heads.first * kvb, heads.count * kvb};
  w.kv_b_stored = row_slice(f.kv_b_stored, kv_rows);
  // A GGUF's quantised halves: head-major rows too (kv_lora_rank key rows, v value rows per head).
  w.k_b_blocks = row_slice(f.k_b_blocks, {heads.first * c.kv_lora_rank, heads.count * c.kv_lora_rank});
  w.v_b_blocks = row_slice(f.v_b_blocks, {heads.first * dv, heads.count * dv});
  if (!f.kv_b.empty()) {
    w.kv_b = Sharder::vec(f.kv_b, kv_rows, c.kv_lora_rank);
    w.kv_b_f32 = row_slice(f.kv_b_f32, kv_rows);
    w.kv_b_f32.data = w.kv_b.data();
  }
}

void shard_moe(Sharder& s, const MoeWeights& f, const ShardPlan& p, MoeWeights& w) {
  w = f;  // router, correction bias, latent down / up / norm are replicated
  w.stacked = {};
  w.experts.clear();
  for (int64_t slot = p.experts.first; slot < p.experts.end(); ++slot) {
    const size_t e = p.expert_parallel ? static_cast<size_t>(p.expert_order[static_cast<size_t>(slot)]) : static_cast<size_t>(slot);
    w.experts.push_back(s.glu(f.experts[e], p.expert_inter, "routed expert down_proj"));
  }
  w.shared = s.glu(f.shared, p.shared_inter, "shared expert down_proj");
}

}  // namespace

ShardedWeights shard_weights(const ModelWeights& full, const ModelConfig& c, const ShardPlan& p) {
  ShardedWeights out;
  Sharder s(p, out);
  ModelWeights& w = out.w;
  w.embed = row_slice(full.embed, p.vocab);  // vocab-parallel, the same rows as lm_head (tied or not)
  w.lm_head = row_slice(full.lm_head, p.vocab);
  w.final_norm = full.final_norm;
  w.out_res = full.out_res;
  w.bound_bytes = full.bound_bytes;
  w.layers.resize(full.layers.size());
  for (size_t l = 0; l < full.layers.size(); ++l) {
    const LayerWeights& F = full.layers[l];
    LayerWeights& L = w.layers[l];
    L.is_kda = F.is_kda;
    L.is_moe = F.is_moe;
    L.input_norm = F.input_norm;
    L.post_attn_norm = F.post_attn_norm;
    L.attn_res = F.attn_res;
    L.mlp_res = F.mlp_res;
    if (F.is_kda)
      shard_kda(s, F.kda, c, p.kda, L.kda);
    else
      shard_mla(s, F.mla, c, p.mla, L.mla);
    if (F.is_moe)
      shard_moe(s, F.moe, p, L.moe);
    else
      L.mlp = s.glu(F.mlp, p.dense_inter, "dense MLP down_proj");
  }
  return out;
}

}  // namespace k3::dist
