// make_proposer (proposer.h): the one place a speculative config becomes a proposer.
#include "k3/engine/proposer.h"

#include "k3/core/error.h"
#include "k3/engine/block_drafter_proposer.h"
#include "k3/engine/draft_model_proposer.h"
#include "k3/engine/ngram_proposer.h"

namespace k3::engine {

std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& cfg, const ModelRunner* draft, int64_t target_vocab,
                                        const drafter::BlockDrafter* block) {
  // parse_speculative_config admits only the methods built here.
  if (cfg.method == "draft_model") {
    if (!draft) throw Error("--speculative-config: method \"draft_model\" needs the draft model loaded (" + cfg.model + ")");
    return std::make_unique<DraftModelProposer>(*draft, target_vocab);
  }
  if (cfg.method == "block_drafter") {
    if (!block) throw Error("--speculative-config: method \"block_drafter\" needs the drafter loaded (" + cfg.model + ")");
    return std::make_unique<BlockDrafterProposer>(*block, cfg.num_speculative_tokens, target_vocab);
  }
  return std::make_unique<NgramProposer>(cfg.prompt_lookup_min, cfg.prompt_lookup_max);
}

}  // namespace k3::engine
