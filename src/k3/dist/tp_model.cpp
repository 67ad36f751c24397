#include "k3/dist/tp_model.h"

#include <cstdio>
#include <cstdlib>

#include "k3/core/error.h"
#include "k3/core/mxfp8.h"
#include "k3/dist/memory_sequence.h"
#include "k3/dist/peer_watch.h"
#include "k3/dist/step_wire.h"
#include "k3/model/dummy_checkpoint.h"
#include "k3/model/graph/forward.h"
#include "k3/model/model_files.h"

namespace k3::dist {

namespace {

// A worker's view of one sequence's cache: rank 0's references resolved in the mirror. The forward only
// reads the views; rank 0 alone grows and advances caches.
class ViewSequence final : public SequenceCache {
 public:
  ViewSequence(const CacheSpec& spec, const WireSeq& s, const MemoryMirror& mirror) : spec_(spec), past_(s.past) {
    // (rank 0 sends no MLA row size when the model has no MLA layer, e.g. a slice cut to its first KDA layers)
    if (s.kda.size() != static_cast<size_t>(4 * spec.kda_layers) || (spec.mla_layers > 0 && s.row_bytes != spec.mla_row_bytes()))
      throw Error("sharded model: a sequence's cache from rank 0 does not match this rank's cache spec");
    const uint64_t conv = static_cast<uint64_t>(spec.kda_conv_floats) * 4;
    for (size_t i = 0; i < s.kda.size(); i += 4)
      kda_.push_back({mirror.resolve(s.kda[i], spec.kda_state_bytes()),
                      reinterpret_cast<float*>(mirror.resolve(s.kda[i + 1], conv)),
                      reinterpret_cast<float*>(mirror.resolve(s.kda[i + 2], conv)),
                      reinterpret_cast<float*>(mirror.resolve(s.kda[i + 3], conv))});
    const uint64_t page_bytes = static_cast<uint64_t>(s.layer_stride) * static_cast<uint64_t>(spec.mla_layers);
    for (const CacheRef& p : s.pages) pages_.push_back(mirror.resolve(p, page_bytes));
    if (spec.mla_layers > 0 && (s.page_tokens <= 0 || s.layer_stride < s.page_tokens * s.row_bytes ||
                                static_cast<int64_t>(pages_.size()) * s.page_tokens < s.past + s.n))
      throw Error("sharded model: an MLA page table from rank 0 that does not cover the step");
    page_tokens_ = s.page_tokens;
    layer_stride_ = s.layer_stride;
    row_bytes_ = s.row_bytes;
  }
  const CacheSpec& spec() const override { return spec_; }
  int64_t n_past() const override { return past_; }
  KdaStateView kda_state(int64_t i) override { return kda_[static_cast<size_t>(i)]; }
  MlaPageTable mla_pages() override { return {pages_, page_tokens_, layer_stride_, row_bytes_}; }
  void reserve(int64_t) override {}
  void advance(int64_t) override {}
  std::unique_ptr<SequenceCache> clone() const override { return nullptr; }

 private:
  CacheSpec spec_;
  int64_t past_;
  std::vector<KdaStateView> kda_;
  std::vector<uint8_t*> pages_;
  int64_t page_tokens_ = 0, layer_stride_ = 0, row_bytes_ = 0;
};

// Rank 0's sequence as references into its journaled memory (throws for a cache from elsewhere).
WireSeq wire_seq(const graph::StepSeq& s, const CacheSpec& spec, const JournaledMemory& mem) {
  WireSeq w{s.offset, s.n, s.past, static_cast<uint8_t>(s.prefill_form), {}, {}, 0, 0, 0};
  const size_t conv = static_cast<size_t>(spec.kda_conv_floats) * 4;
  for (int64_t i = 0; i < spec.kda_layers; ++i) {
    const KdaStateView v = s.cache->kda_state(i);
    w.kda.push_back(mem.locate(v.S, static_cast<size_t>(spec.kda_state_bytes())));
    for (const float* c : {v.conv_q, v.conv_k, v.conv_v}) w.kda.push_back(mem.locate(c, conv));
  }
  if (spec.mla_layers > 0) {
    const MlaPageTable t = s.cache->mla_pages();
    for (uint8_t* p : t.pages) w.pages.push_back(mem.locate(p));
    w.page_tokens = t.page_tokens;
    w.layer_stride = t.layer_stride;
    w.row_bytes = t.row_bytes;
  }
  return w;
}

// Whether every rank says ok (one byte each).
bool all_ok(Communicator& comm, bool ok) {
  std::vector<uint8_t> all(static_cast<size_t>(comm.size()));
  const uint8_t mine = ok ? 1 : 0;
  comm.all_gather(&mine, 1, all.data());
  for (uint8_t a : all)
    if (!a) return false;
  return true;
}

// --moe-activation-dtype mxfp8 / q8 on a sharded model (CPU or GPU ranks): each rank's slice of an expert's intermediate must start on a block of 32 and hold whole
// blocks (or end the row), so that the GLU output rows it rounds are the unsharded model's blocks (the expert
// input rows are whole on every rank).
void check_moe_activation(const TpLoadOptions& opt, const ModelConfig& cfg, const ShardPlan& plan) {
  if (opt.moe_activation == MoeActivationDType::F32) return;
  const std::string what = std::string("--moe-activation-dtype ") + moe_activation_dtype_name(opt.moe_activation);
  const Range r = plan.expert_inter;
  if (cfg.num_experts > 0 && (r.first % kMxBlock != 0 || (r.count % kMxBlock != 0 && r.end() != cfg.moe_intermediate_size)))
    throw Error(what + ": this rank's routed-expert columns " + std::to_string(r.first) + ".." + std::to_string(r.end()) +
                " do not fall on the blocks of " + std::to_string(kMxBlock) + " (moe_intermediate_size " +
                std::to_string(cfg.moe_intermediate_size) + " over --tensor-parallel-size " + std::to_string(plan.size) +
                "); use --enable-expert-parallel or fewer ranks");
}

}  // namespace

std::unique_ptr<TpModel> TpModel::load(const std::string& dir, std::unique_ptr<Communicator> comm,
                                       const TpLoadOptions& opt) {
  auto m = std::unique_ptr<TpModel>(new TpModel());
  m->comm_ = std::move(comm);
  std::string err;
  try {
    m->load_shard(dir, opt);
  } catch (const Error& e) {
    err = e.what();
  }
  if (!all_ok(*m->comm_, err.empty())) {
    if (!err.empty()) throw Error(err);
    throw Error("rank " + std::to_string(m->comm_->rank()) + ": another rank failed to load the model (see its message)");
  }
  m->ready_ = true;
  return m;
}

void TpModel::load_shard(const std::string& dir, const TpLoadOptions& opt) {
  ModelFiles files = opt.dummy ? dummy_model_files(*opt.dummy, opt.dummy_seed) : open_model_files(dir);
  cfg_ = std::move(files.config);
  ckpt_ = std::move(files.checkpoint);
  plan_ = make_shard_plan(cfg_, comm_->rank(), comm_->size(), opt.expert_parallel, opt.placement);
  plan_.collectives_at_one_rank = opt.collectives_at_one_rank;
  local_cfg_ = dist::shard_config(cfg_, plan_);
  spec_ = make_cache_spec(local_cfg_, opt.kv, opt.ssm);
  full_ = bind_weights(cfg_, *ckpt_, nullptr, opt.weights_device);
  shard_ = shard_weights(full_, cfg_, plan_);
  copied_bytes_ = shard_.copied_bytes;
  check_moe_activation(opt, cfg_, plan_);
  const RankShard rs{local_cfg_, shard_.w, plan_, spec_, *comm_, opt.moe_activation};
  device_ = opt.device ? opt.device(rs) : make_cpu_rank_device(rs, comm_->size());
  if (!device_->reads_host_weights()) {  // the device holds its copy: the mapping and the slices can go
    shard_ = {};
    full_ = {};
    ckpt_.reset();
  }
  memory_ = std::make_shared<JournaledMemory>(device_->cache_memory());
  if (opt.print_plan && plan_.sharded()) std::fprintf(stderr, "k3: %s\n", describe(plan_).c_str());
}

TpModel::~TpModel() {
  if (!ready_ || !comm_->is_root() || comm_->size() == 1 || !failure().empty()) return;
  try {
    std::lock_guard lk(mu_);
    StepMessage stop;
    stop.kind = StepMessage::Stop;
    send_step(*comm_, stop);
  } catch (const std::exception& e) {
    fail("stopping the other ranks", e);
  }
}

std::string TpModel::device_name() const {
  if (!plan_.sharded()) return device_->name();
  return device_->name() + " (tensor parallel " + std::to_string(comm_->size()) + (plan_.expert_parallel ? " + expert parallel" : "") +
         " over " + comm_->name() + ")";
}

std::unique_ptr<SequenceCache> TpModel::new_cache() const { return std::make_unique<MemorySequence>(spec_, memory_); }

int64_t TpModel::memory_available() const { return device_->memory_available(); }

void TpModel::fail(const char* where, const std::exception& e) const {
  std::fprintf(stderr, "k3: error: rank %d, %s: %s\n", comm_->rank(), where, e.what());
  std::fflush(stderr);
  comm_->abort(1);
  std::abort();  // abort() does not return; this tells the compiler so
}

std::string TpModel::failure() const {
  std::lock_guard lk(failure_mu_);
  return failure_;
}

void TpModel::forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                            const ForwardOptions& opt) const {
  if (!comm_->is_root()) throw Error("forward_batch on rank " + std::to_string(comm_->rank()) + ": only rank 0 plans steps");
  if (!opt.tap_layers.empty()) throw Error("forward: taps (a block drafter's inputs) are not supported with tensor parallel yet");
  std::lock_guard lk(mu_);
  if (std::string f = failure(); !f.empty()) throw Error(f);
  const graph::StepPlan plan = graph::plan_step(items, opt, cfg_.vocab_size, spec_);
  StepMessage msg;
  if (plan_.sharded()) {  // everything that can fail on bad input fails here, before any rank is involved
    for (const graph::StepSeq& s : plan.seqs) msg.seqs.push_back(wire_seq(s, spec_, *memory_));
    msg.ops = memory_->take_journal();
    msg.kda_chunk = plan.kda_chunk;
    msg.tokens = plan.tokens;
    msg.logit_rows = plan.logit_rows;
  }
  logits.resize(static_cast<size_t>(plan.n_logits() * cfg_.vocab_size));
  try {
    if (plan_.sharded()) send_step(*comm_, msg);
    device_->forward(plan, logits.data());
  } catch (const PeerLost& e) {
    // The group cannot run another step; the caller fails the requests (and a server stops).
    const std::string why = "the tensor-parallel group lost a rank: " + std::string(e.what());
    std::fprintf(stderr, "k3: error: rank 0: %s\n", why.c_str());
    std::fflush(stderr);
    {
      std::lock_guard fl(failure_mu_);
      failure_ = why;
    }
    throw Error(why);
  } catch (const std::exception& e) {
    fail("forward", e);  // the other ranks are inside the step: they cannot be told apart from a hang
  }
  graph::finish_step(plan);
}

void TpModel::run_worker() {
  if (comm_->is_root()) throw Error("run_worker on rank 0");
  MemoryMirror mirror(device_->cache_memory());
  try {
    for (;;) {
      StepMessage m = receive_step(*comm_);
      if (m.kind == StepMessage::Stop) return;
      mirror.apply(m.ops);
      std::vector<std::unique_ptr<ViewSequence>> views;
      graph::StepPlan plan;
      plan.kda_chunk = m.kda_chunk;
      plan.tokens = std::move(m.tokens);
      plan.logit_rows = std::move(m.logit_rows);
      for (const WireSeq& s : m.seqs) {
        views.push_back(std::make_unique<ViewSequence>(spec_, s, mirror));
        plan.seqs.push_back({s.offset, s.n, s.past, views.back().get(), s.prefill_form != 0});
      }
      check_step_plan(plan, cfg_.vocab_size);
      device_->forward(plan, nullptr);  // the logits go to rank 0 alone: nothing to hold here
    }
  } catch (const std::exception& e) {
    fail("worker step", e);
  }
}

}  // namespace k3::dist
