// SerialEngine: the simple Engine behind `k3 serve` (tiny random checkpoint + test tokenizer).
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "k3/core/error.h"
#include "k3/engine/generator.h"
#include "k3/engine/serial_engine.h"
#include "test_util.h"

namespace {

struct Collect {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<k3::engine::RequestOutput> outs;
  bool done = false;
  k3::engine::OutputCallback cb() {
    return [this](const k3::engine::RequestOutput& o) {
      std::lock_guard lk(mu);
      outs.push_back(o);
      if (o.finished) {
        done = true;
        cv.notify_all();
      }
    };
  }
  void wait() {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return done; }));
  }
  std::string text() {
    std::string s;
    for (auto& o : outs)
      for (auto& p : o.pieces) s += p.text;
    return s;
  }
};

struct Env {
  std::unique_ptr<k3::Model> model = k3::Model::load(k3test::source_path("tests/data/tiny-k3"));
  k3::text::Tokenizer tok = k3::text::Tokenizer::load(k3test::source_path("tests/data/tiny-tokenizer"));
};
Env& env() {
  static Env e;
  return e;
}

}  // namespace

TEST(SerialEngine, MatchesGenerator) {
  k3::engine::SerialEngine eng(*env().model, env().tok, {.max_model_len = 256});
  k3::engine::Request r;
  r.id = "a";
  r.prompt = {768, 300, 301, 302};
  r.params.temperature = 0;
  r.params.max_tokens = 12;
  r.params.ignore_eos = true;
  r.top_logprobs = 2;
  r.skip_special_text = false;  // special tokens as text, like generate()
  Collect c;
  eng.submit(r, c.cb());
  c.wait();
  auto g = k3::engine::generate(*env().model, env().tok, r.prompt, r.params, nullptr);
  EXPECT_EQ(c.text(), g.text);
  ASSERT_TRUE(c.outs.back().finished);
  EXPECT_EQ(c.outs.back().finish_reason, "length");
  EXPECT_EQ(c.outs.back().completion_tokens, 12);
  EXPECT_EQ(c.outs.back().prompt_tokens, 4);
  int n = 0;
  for (auto& o : c.outs) {
    n += static_cast<int>(o.new_token_ids.size());
    ASSERT_EQ(o.logprobs.size(), o.new_token_ids.size());
    for (auto& lp : o.logprobs) {
      EXPECT_EQ(lp.top.size(), 2u);
      EXPECT_EQ(lp.top[0].first, lp.id);  // greedy picks the most likely
    }
  }
  EXPECT_EQ(n, 12);
  eng.shutdown(true);
}

TEST(SerialEngine, RejectsTooLongPromptsAndBadParams) {
  k3::engine::SerialEngine eng(*env().model, env().tok, {.max_model_len = 8});
  k3::engine::Request r;
  r.id = "x";
  r.prompt.assign(8, 300);
  EXPECT_THROW(eng.submit(r, [](const k3::engine::RequestOutput&) {}), k3::Error);
  r.prompt.assign(2, 300);
  r.params.top_p = 0;
  EXPECT_THROW(eng.submit(r, [](const k3::engine::RequestOutput&) {}), k3::Error);
  r.params.top_p = 1;
  r.prompt = {5000};
  EXPECT_THROW(eng.submit(r, [](const k3::engine::RequestOutput&) {}), k3::Error);
}

TEST(SerialEngine, CancelRunningAndQueued) {
  k3::engine::SerialEngine eng(*env().model, env().tok, {.max_model_len = 4096});
  k3::engine::Request r;
  r.prompt = {768, 300};
  r.params.max_tokens = 3000;
  r.params.ignore_eos = true;
  Collect a, b;
  r.id = "a";
  eng.submit(r, a.cb());
  r.id = "b";
  eng.submit(r, b.cb());
  for (int i = 0; i < 2000 && eng.stats().running == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  eng.cancel("b");  // queued
  eng.cancel("a");  // running
  a.wait();
  b.wait();
  EXPECT_EQ(a.outs.back().finish_reason, "abort");
  EXPECT_EQ(b.outs.back().finish_reason, "abort");
  EXPECT_LT(a.outs.back().completion_tokens, 3000);
  auto st = eng.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  eng.shutdown(false);
  EXPECT_THROW(eng.submit(r, [](const k3::engine::RequestOutput&) {}), k3::Error);
}

TEST(SerialEngine, StopStringsAndShutdownAbort) {
  k3::engine::SerialEngine eng(*env().model, env().tok, {.max_model_len = 4096});
  k3::engine::Request r;
  r.id = "s";
  r.prompt = {768, 400, 401};
  r.params.temperature = 0;
  r.params.max_tokens = 20;
  r.params.ignore_eos = true;
  Collect full;
  eng.submit(r, full.cb());
  full.wait();
  const std::string t = full.text();
  ASSERT_GT(t.size(), 6u);
  r.params.stop = {t.substr(3, 2)};
  Collect s;
  eng.submit(r, s.cb());
  s.wait();
  EXPECT_EQ(s.text(), t.substr(0, t.find(r.params.stop[0])));
  EXPECT_EQ(s.outs.back().finish_reason, "stop");
  // shutdown(false) aborts a long request with a final output
  r.params.stop.clear();
  r.params.max_tokens = 3000;
  Collect l;
  eng.submit(r, l.cb());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  eng.shutdown(false);
  l.wait();
  EXPECT_EQ(l.outs.back().finish_reason, "abort");
}
