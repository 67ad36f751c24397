// `k3 chat [-m DIR] [--temp T] [-n N] [--system TEXT] ...`: an interactive chat in the terminal (llama-cli's
// conversation mode): the model's chat template over the whole history, replies streamed, reasoning dim,
// /commands (chat_commands.h), Ctrl-C stops a reply. With stdin not a terminal it reads one message (or
// command) per line and prints the replies, without prompts or colours. docs/cli.md.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>

#include "cli/chat_commands.h"
#include "cli/chat_terminal.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_loader.h"
#include "k3/cache/hybrid_cache.h"
#include "k3/core/error.h"
#include "k3/engine/batch_engine.h"
#include "k3/serve/model_chat_adapter.h"
#include "k3/text/utf8.h"

namespace k3cli {

namespace {

struct ChatOpts {
  std::string model, system;
  k3::engine::SamplingParams sp;  // temperature and max_tokens live in ChatState (changed by /commands)
  float temperature = 0.8f;
  int max_tokens = 1024;
  std::optional<uint64_t> seed;
  int64_t ctx_size = 4096;
  bool hide_reasoning = false;
  DeviceOptions dev;
};

void out(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}
// Notes and errors go to stderr: stdout carries the replies alone (what a script piping into k3 chat reads).
void note(const std::string& s) {
  std::fflush(stdout);
  std::fwrite(s.data(), 1, s.size(), stderr);
  std::fflush(stderr);
}

// One reply: streams it as it comes (reasoning dim, then the answer, then tool calls) and returns the
// assistant message for the history.
class ReplyPrinter {
 public:
  ReplyPrinter(const ChatTerminal& term, bool show_reasoning) : term_(term), show_reasoning_(show_reasoning) {}

  void on_delta(const k3::serve::ChatDelta& d) {
    if (!d.reasoning_content.empty()) {
      reasoning_ += d.reasoning_content;
      if (show_reasoning_) {
        if (!in_reasoning_ && !term_.color()) out("(thinking) ");
        in_reasoning_ = true;
        out(term_.styled("2", d.reasoning_content));
      }
    }
    if (!d.content.empty()) {
      end_reasoning();
      content_ += d.content;
      out(d.content);
      wrote_content_ = true;
    }
    for (const auto& tc : d.tool_calls) {
      if (tc.index >= static_cast<int>(calls_.size())) calls_.resize(tc.index + 1, {{"type", "function"}});
      auto& c = calls_[tc.index];
      if (!tc.id.empty()) c["id"] = tc.id;
      if (!tc.name.empty()) c["function"]["name"] = c["function"].value("name", "") + tc.name;
      c["function"]["arguments"] = c["function"].value("arguments", "") + tc.arguments;
    }
  }

  // The end of the reply; `note` (e.g. "[stopped]") is shown after it.
  nlohmann::json finish(const std::string& note) {
    end_reasoning();
    for (const auto& c : calls_) {
      if (wrote_content_) out("\n");
      out(term_.styled("36", "[tool call] " + c["function"].value("name", "") + " " +
                                 c["function"].value("arguments", "")));
      wrote_content_ = true;
    }
    if (!note.empty()) out((wrote_content_ ? " " : "") + term_.styled("33", note));
    out("\n");
    nlohmann::json msg = {{"role", "assistant"}, {"content", content_}};
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (!calls_.empty()) msg["tool_calls"] = calls_;
    return msg;
  }

 private:
  void end_reasoning() {
    if (in_reasoning_) out("\n");
    in_reasoning_ = false;
  }
  const ChatTerminal& term_;
  const bool show_reasoning_;
  bool in_reasoning_ = false, wrote_content_ = false;
  std::string reasoning_, content_;
  std::vector<nlohmann::json> calls_;
};

struct ChatModel {
  k3::engine::BatchEngine& engine;
  const k3::serve::ChatAdapter& chat;
  int64_t ctx_size;
};

// Runs one turn over state.request(); appends the reply to the history. False (history unchanged but for
// the user message being dropped) when the turn could not run.
bool run_turn(ChatModel& m, ChatState& st, const ChatOpts& o, ChatTerminal& term, int turn) {
  const nlohmann::json request = st.request();
  std::vector<int32_t> prompt;
  try {
    prompt = m.chat.render(request);
  } catch (const k3::Error& e) {
    note(term.styled("31", std::string("error: ") + e.what()) + "\n");
    return false;
  }
  const int64_t room = m.ctx_size - static_cast<int64_t>(prompt.size());
  if (room < 1) {
    note(term.styled("31", "error: the conversation (" + std::to_string(prompt.size()) + " tokens) no longer fits the " +
                              "context of " + std::to_string(m.ctx_size) + " tokens: /reset, or a larger -c") + "\n");
    return false;
  }
  k3::engine::Request req;
  req.id = "chat-" + std::to_string(turn);
  req.prompt = std::move(prompt);
  req.params = o.sp;
  req.params.temperature = st.temperature;
  req.params.max_tokens = static_cast<int>(std::min<int64_t>(st.max_tokens, room));
  req.params.seed = o.seed ? *o.seed : static_cast<uint64_t>(std::random_device{}());
  if (!o.sp.ignore_eos)  // end-of-turn markers act like EOS (as in k3 serve)
    for (int32_t id : m.chat.stop_token_ids()) req.params.stop_token_ids.push_back(id);
  req.params.validate();

  ReplyPrinter printer(term, !o.hide_reasoning);
  auto parser = m.chat.make_parser(request, req.id);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string finish, error;
  ChatTerminal::take_interrupt();  // a Ctrl-C from before this reply does not stop it
  m.engine.submit(std::move(req), [&](const k3::engine::RequestOutput& o2) {
    printer.on_delta(k3::serve::chat_step(*parser, o2.pieces, o2.finished));
    if (o2.finished) {
      std::lock_guard lk(mu);
      finish = o2.finish_reason;
      error = o2.error;
      done = true;
      cv.notify_all();
    }
  });
  {
    std::unique_lock lk(mu);
    bool cancelled = false;
    while (!done) {
      cv.wait_for(lk, std::chrono::milliseconds(50));
      if (!cancelled && ChatTerminal::take_interrupt()) {
        m.engine.cancel("chat-" + std::to_string(turn));  // the final output (finish "abort") follows
        cancelled = true;
      }
    }
  }
  if (finish == "error") {
    printer.finish("");
    note(term.styled("31", "error: " + error) + "\n");
    return false;
  }
  st.history.push_back(printer.finish(finish == "abort" ? "[stopped]" : finish == "length" ? "[max tokens]" : ""));
  return true;
}

// Reads one message: lines ending in '\' continue it. Eof / Interrupted with nothing read end the chat.
ChatTerminal::Read read_message(ChatTerminal& term, std::string& msg) {
  msg.clear();
  std::string line;
  for (bool first = true;; first = false) {
    if (term.interactive()) out(term.styled("1", first ? "> " : ". "));
    const auto r = term.read_line(line);
    if (r != ChatTerminal::Read::Line) {
      if (term.interactive()) out("\n");
      return r;
    }
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      msg += line + "\n";
      continue;
    }
    msg += line;
    return ChatTerminal::Read::Line;
  }
}

int chat_loop(ChatModel& m, const ChatOpts& o, ChatTerminal& term) {
  ChatState st;
  st.system = o.system;
  st.temperature = o.temperature;
  st.max_tokens = o.max_tokens;
  std::string msg;
  for (int turn = 0;;) {
    if (read_message(term, msg) != ChatTerminal::Read::Line) return 0;  // Ctrl-D, or Ctrl-C at the prompt
    if (msg.find_first_not_of(" \t\n") == std::string::npos) continue;
    // A terminal in another encoding (Latin-1...) sends bytes that are not UTF-8: each ill-formed part becomes
    // U+FFFD, as the tokenizer's decoding does (the chat request is JSON, which holds UTF-8 only).
    if (!k3::text::is_valid_utf8(msg)) msg = k3::text::utf8_lossy(msg);
    if (msg[0] == '/') {
      const CommandResult r = run_chat_command(msg, st);
      if (!r.message.empty()) note(term.styled(r.error ? "31" : "2", r.message) + "\n");
      if (r.exit) return 0;
      continue;
    }
    st.history.push_back({{"role", "user"}, {"content", msg}});
    if (!run_turn(m, st, o, term, ++turn)) st.history.erase(st.history.end() - 1);
    if (term.interactive()) out("\n");
  }
}

}  // namespace

void add_chat(CLI::App& app, Registry& reg) {
  auto o = std::make_shared<ChatOpts>();
  auto* cmd = app.add_subcommand("chat", "Chat with the model in the terminal (history, streamed replies, /help)");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory or GGUF file (default: the built-in model)");
  cmd->add_option("-n,--max-tokens", o->max_tokens, "most tokens per reply (/max changes it)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--temp,--temperature", o->temperature, "sampling temperature, 0 = greedy (/temp changes it)")
      ->capture_default_str()->check(finite_number())->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", o->sp.top_k, "top-k (0 = off)");
  cmd->add_option("--top-p", o->sp.top_p, "top-p (1 = off)")->check(finite_number());
  cmd->add_option("--min-p", o->sp.min_p, "min-p (0 = off)")->check(finite_number());
  cmd->add_option("--repeat-penalty", o->sp.repetition_penalty, "repetition penalty (1 = off)")->check(finite_number());
  cmd->add_option("--seed", o->seed, "random seed of every reply (default: random)");
  cmd->add_option("-c,--ctx-size", o->ctx_size,
                  "tokens of the whole conversation (prompt + replies); 0: the model's max_position_embeddings")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("-s,--system", o->system, "system prompt (/system changes it)");
  cmd->add_flag("--ignore-eos", o->sp.ignore_eos, "keep generating past end-of-turn and end-of-sequence tokens");
  cmd->add_flag("--hide-reasoning", o->hide_reasoning, "do not print the model's reasoning");
  add_device_options(cmd, o->dev);
  cmd->callback([&reg, o] {
    reg.action = [o] {
      {  // sampling flags checked before the model loads
        auto sp = o->sp;
        sp.temperature = o->temperature;
        sp.max_tokens = o->max_tokens;
        sp.validate();
      }
      const std::string dir = resolve_model_dir(o->model);
      auto model = load_model(dir, o->dev);
      auto tok = load_tokenizer(dir, o->dev);
      const auto& cfg = model->config();
      check_tokenizer_fits(tok.n_vocab(), cfg.vocab_size);
      int64_t ctx = o->ctx_size;
      if (ctx == 0 || (cfg.max_position_embeddings > 0 && ctx > cfg.max_position_embeddings))
        ctx = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 4096;

      k3::serve::ModelChatAdapterOptions co;
      co.bos = static_cast<int32_t>(cfg.bos_token_id >= 0 ? cfg.bos_token_id : tok.bos_id());
      if (cfg.eos_token_id >= 0) co.extra_stop.push_back(static_cast<int32_t>(cfg.eos_token_id));
      auto chat = k3::serve::make_model_chat_adapter(cfg.model_type, tok, co);

      // One sequence of the whole context, and room for a second: the previous turn stays in the prefix
      // cache, so a new turn prefills only what was added (as llama-cli keeps its KV cache).
      k3::engine::BatchEngineOptions eo;
      eo.cache.page_tokens = 16;
      eo.cache.prefix_caching = true;
      eo.cache.budget_bytes = k3::cache::HybridCache::budget_for(model->cache_spec(), eo.cache.page_tokens, 2, ctx + 1);
      eo.sched.max_num_seqs = 1;
      eo.sched.max_num_batched_tokens = 512;
      eo.max_model_len = ctx;
      k3::engine::BatchEngine engine(*model, tok, eo);

      ChatTerminal term;
      if (term.interactive())
        std::fprintf(stderr, "k3 chat: %s, context %lld tokens. /help lists the commands; Ctrl-C stops a reply, "
                     "Ctrl-D (or Ctrl-C at the prompt) exits.\n", dir.c_str(), (long long)ctx);
      ChatModel m{engine, *chat, ctx};
      const int rc = chat_loop(m, *o, term);
      engine.shutdown(false);
      return rc;
    };
  });
}

}  // namespace k3cli
