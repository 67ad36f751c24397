// A simple, correct Engine: one engine thread, a FIFO queue, one request at a time (prefill, then
// token-by-token decode with Sampler + StreamDecoder + StopMatcher), a delta per token, cancel
// honoured between tokens. The reference the continuous-batching engine replaces behind Engine.
#pragma once
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>

#include "k3/engine/engine_api.h"
#include "k3/model/model.h"
#include "k3/text/tokenizer.h"

namespace k3::engine {

struct SerialEngineOptions {
  int64_t max_model_len = 4096;  // prompt + completion tokens per sequence
  int64_t max_num_seqs = 1;      // reported in limits(); this engine runs one at a time
  int64_t prefill_chunk = 512;
};

class SerialEngine final : public Engine {
 public:
  // The model and tokenizer must outlive the engine. Starts the engine thread.
  SerialEngine(const Model& model, const text::Tokenizer& tok, SerialEngineOptions opt = {});
  ~SerialEngine() override;

  void submit(Request req, OutputCallback on_output) override;
  void cancel(const std::string& request_id) override;
  EngineStats stats() const override;
  EngineLimits limits() const override;
  void shutdown(bool drain) override;

 private:
  struct Item {
    Request req;
    OutputCallback cb;
  };
  void loop();
  void run_one(Item& item);
  bool take_cancel(const std::string& id);  // true (and forgets it) if id was cancelled

  const Model& model_;
  const text::Tokenizer& tok_;
  SerialEngineOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::unordered_set<std::string> cancelled_;
  std::string running_id_;
  bool accepting_ = true, stop_ = false, abort_all_ = false;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace k3::engine
