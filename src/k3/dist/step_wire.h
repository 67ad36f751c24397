// What rank 0 sends the other ranks of a sharded model before each step: the cache operations since the
// last step (mirrored_memory.h), then the step's plan (graph::StepPlan) with each sequence's cache as
// references into the mirrored memory. Every rank then runs the same graph::forward on its shard.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "k3/dist/communicator.h"
#include "k3/dist/mirrored_memory.h"
#include "k3/model/graph/step.h"

namespace k3::dist {

struct WireSeq {
  int64_t offset = 0, n = 0, past = 0;
  uint8_t prefill_form = 0;
  std::vector<CacheRef> kda;    // 4 per KDA layer: S, conv_q, conv_k, conv_v
  std::vector<CacheRef> pages;  // the MLA page table
  int64_t page_tokens = 0, layer_stride = 0, row_bytes = 0;
};

struct StepMessage {
  enum Kind : uint32_t { Step = 1, Stop = 2 };
  uint32_t kind = Step;
  std::vector<MemOp> ops;
  int32_t kda_chunk = 0;
  std::vector<int32_t> tokens, logit_rows;
  std::vector<WireSeq> seqs;
};

std::vector<uint8_t> encode(const StepMessage& m);
// Throws k3::Error on a truncated or malformed message.
StepMessage decode(std::span<const uint8_t> bytes);

// A worker trusts rank 0 (the same job), but a plan whose sequences do not tile its tokens, or with a token
// or logit row out of range, would make the forward read outside its buffers: throws k3::Error for one.
void check_step_plan(const graph::StepPlan& p, int64_t vocab);

// Rank 0: the message to every other rank (its size, then its bytes).
void send_step(Communicator& comm, const StepMessage& m);
// Any other rank: waits for rank 0's next message.
StepMessage receive_step(Communicator& comm);

}  // namespace k3::dist
