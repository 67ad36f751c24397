// Collects the streamed outputs of many engine requests (ids, text, finish reason, cached prompt tokens) and
// waits until a number of them have finished: the engine tests' one callback sink.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "k3/engine/batch_engine.h"

namespace k3test {

struct OutputCollector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<int32_t>> ids;
  std::map<std::string, std::string> text, reason;
  std::map<std::string, int64_t> cached;
  int done = 0;
  k3::engine::OutputCallback cb() {
    return [this](const k3::engine::RequestOutput& o) {
      std::lock_guard lk(mu);
      auto& v = ids[o.request_id];
      v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      for (auto& p : o.pieces) {
        std::string& t = text[o.request_id];
        if (p.special_id < 0) {
          t += p.text;
          continue;
        }
        t += '<';  // appended piecewise: GCC 12's -Wrestrict misfires on "<" + std::string
        t += std::to_string(p.special_id);
        t += '>';
      }
      if (o.finished) {
        reason[o.request_id] = o.finish_reason;
        cached[o.request_id] = o.cached_prompt_tokens;
        ++done;
        cv.notify_all();
      }
    };
  }
  // Fails the test (not a hang) if fewer than n requests finish within 300 s.
  void wait(int n) {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(300), [&] { return done >= n; }));
  }
};

}  // namespace k3test
