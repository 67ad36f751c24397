// Data parallel serving (vLLM's --data-parallel-size): D whole-model replicas, one engine each, behind
// one front end. Each request runs on one replica from start to end; the others never see it. Replicas
// share nothing (no prefix cache, no cache pages), so dispatch trades load balance against prefix reuse:
// the least-loaded replica wins, and among equally loaded ones a hash of the request's prefix picks, so
// that requests sharing a prompt prefix (a system prompt, a conversation's earlier turns) meet the
// replica whose prefix cache holds it.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "k3/engine/engine_api.h"

namespace k3::engine {

class DataParallelEngine final : public Engine {
 public:
  // Prompt tokens the dispatch hash reads (with the cache salt): a prefix long enough to tell system
  // prompts apart, short enough that a conversation's later turns hash as its first did.
  static constexpr size_t kAffinityTokens = 64;

  // Takes the replicas: at least one, else k3::Error.
  explicit DataParallelEngine(std::vector<std::unique_ptr<Engine>> replicas);
  ~DataParallelEngine() override;

  // On the replica with the fewest requests in flight; ties go to the one the prefix hash names (or
  // the first tied one after it). A replica's refusal (k3::Error) is rethrown with nothing left booked.
  void submit(Request req, OutputCallback on_output) override;
  void cancel(const std::string& request_id) override;  // to the replica running it
  // Counters summed over the replicas (see stats() for the exceptions).
  EngineStats stats() const override;
  // What every replica can serve: the smallest max_model_len and vocabulary; max_num_seqs summed.
  EngineLimits limits() const override;
  void shutdown(bool drain) override;

  size_t size() const { return replicas_.size(); }
  // Requests each replica has in flight (submitted, final output not yet delivered).
  std::vector<int64_t> in_flight() const;
  // The replica a request with this salt and prompt goes to when every replica is equally loaded.
  static size_t affinity(const std::string& cache_salt, const std::vector<int32_t>& prompt, size_t replicas);

 private:
  size_t pick_locked(const Request& req) const;
  void finished(size_t replica, const std::string& request_id);

  std::vector<std::unique_ptr<Engine>> replicas_;
  mutable std::mutex mu_;  // guards the books below; never held while a replica or a callback runs
  std::vector<int64_t> in_flight_;
  std::unordered_map<std::string, size_t> owner_;  // live request id -> its replica
  bool accepting_ = true;
};

}  // namespace k3::engine
