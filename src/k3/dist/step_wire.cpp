#include "k3/dist/step_wire.h"

#include <cstring>
#include <string>
#include <type_traits>

#include "k3/core/error.h"

namespace k3::dist {

namespace {

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    for (const T& x : v) put(x);
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    if (b_.size() - pos_ < sizeof(T)) throw Error("sharded model: a truncated step message from rank 0");
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> get_vec() {
    const uint64_t n = get<uint64_t>();
    if (n > (b_.size() - pos_) / sizeof(T)) throw Error("sharded model: a step message's count runs past its end");
    std::vector<T> v(static_cast<size_t>(n));
    for (T& x : v) x = get<T>();
    return v;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

// Field by field: MemOp has padding, whose bytes must not travel.
void put_ops(Writer& w, const std::vector<MemOp>& ops) {
  w.put<uint64_t>(ops.size());
  for (const MemOp& op : ops) {
    w.put(op.kind);
    for (uint64_t v : {op.region, op.offset, op.src_region, op.src_offset, op.bytes}) w.put(v);
  }
}

std::vector<MemOp> get_ops(Reader& r, size_t limit) {
  const uint64_t n = r.get<uint64_t>();
  if (n > limit / (1 + 5 * sizeof(uint64_t))) throw Error("sharded model: a step message's count runs past its end");
  std::vector<MemOp> ops(static_cast<size_t>(n));
  for (MemOp& op : ops) {
    op.kind = r.get<uint8_t>();
    for (uint64_t* v : {&op.region, &op.offset, &op.src_region, &op.src_offset, &op.bytes}) *v = r.get<uint64_t>();
  }
  return ops;
}

}  // namespace

std::vector<uint8_t> encode(const StepMessage& m) {
  Writer w;
  w.put(m.kind);
  put_ops(w, m.ops);
  w.put(m.kda_chunk);
  w.put_vec(m.tokens);
  w.put_vec(m.logit_rows);
  w.put<uint64_t>(m.seqs.size());
  for (const WireSeq& s : m.seqs) {
    w.put(s.offset);
    w.put(s.n);
    w.put(s.past);
    w.put(s.prefill_form);
    w.put_vec(s.kda);
    w.put_vec(s.pages);
    w.put(s.page_tokens);
    w.put(s.layer_stride);
    w.put(s.row_bytes);
  }
  return std::move(w.out);
}

StepMessage decode(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  StepMessage m;
  m.kind = r.get<uint32_t>();
  if (m.kind != StepMessage::Step && m.kind != StepMessage::Stop)
    throw Error("sharded model: unknown message kind " + std::to_string(m.kind) + " from rank 0");
  m.ops = get_ops(r, bytes.size());
  m.kda_chunk = r.get<int32_t>();
  m.tokens = r.get_vec<int32_t>();
  m.logit_rows = r.get_vec<int32_t>();
  const uint64_t n = r.get<uint64_t>();
  if (n > bytes.size()) throw Error("sharded model: a step message's sequence count runs past its end");
  m.seqs.resize(static_cast<size_t>(n));
  for (WireSeq& s : m.seqs) {
    s.offset = r.get<int64_t>();
    s.n = r.get<int64_t>();
    s.past = r.get<int64_t>();
    s.prefill_form = r.get<uint8_t>();
    s.kda = r.get_vec<CacheRef>();
    s.pages = r.get_vec<CacheRef>();
    s.page_tokens = r.get<int64_t>();
    s.layer_stride = r.get<int64_t>();
    s.row_bytes = r.get<int64_t>();
  }
  if (!r.done()) throw Error("sharded model: trailing bytes after a step message");
  return m;
}

void check_step_plan(const graph::StepPlan& p, int64_t vocab) {
  int64_t next = 0;
  for (const graph::StepSeq& s : p.seqs) {
    if (s.offset != next || s.n <= 0 || s.past < 0 || s.n > p.n_tokens() - s.offset)
      throw Error("sharded model: a step from rank 0 whose sequences do not tile its tokens");
    next += s.n;
  }
  if (next != p.n_tokens() || p.seqs.empty()) throw Error("sharded model: a step from rank 0 with stray tokens");
  for (int32_t t : p.tokens)
    if (t < 0 || t >= vocab)
      throw Error("sharded model: token id " + std::to_string(t) + " from rank 0 is outside the vocabulary");
  for (int32_t r : p.logit_rows)
    if (r < 0 || r >= p.n_tokens()) throw Error("sharded model: a logit row from rank 0 outside the step");
}

void send_step(Communicator& comm, const StepMessage& m) {
  std::vector<uint8_t> bytes = encode(m);
  uint64_t n = bytes.size();
  comm.broadcast(&n, sizeof n, 0);
  comm.broadcast(bytes.data(), bytes.size(), 0);
}

StepMessage receive_step(Communicator& comm) {
  uint64_t n = 0;
  comm.broadcast(&n, sizeof n, 0);
  if (n > (uint64_t{1} << 31)) throw Error("sharded model: a step message of " + std::to_string(n) + " bytes");
  std::vector<uint8_t> bytes(static_cast<size_t>(n));
  comm.broadcast(bytes.data(), bytes.size(), 0);
  return decode(bytes);
}

}  // namespace k3::dist
