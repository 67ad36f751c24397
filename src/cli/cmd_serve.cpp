// `k3 serve [-m DIR] [--host H] [--port P] ...`: the OpenAI-compatible HTTP server (docs/serving.md).
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/common.h"
#include "k3/core/error.h"
#include "k3/engine/serial_engine.h"
#include "k3/model/model.h"
#include "k3/serve/model_chat_adapter.h"
#include "k3/serve/server.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

void add_serve(CLI::App& app, Registry& reg) {
  struct Opts {
    std::string model, served_name;
    k3::serve::ServerOptions so;
    int64_t max_num_seqs = 16, max_model_len = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, ...)");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory (default: the built-in model)");
  cmd->add_option("--host", o->so.host, "address to bind")->capture_default_str();
  cmd->add_option("--port", o->so.port, "TCP port (0 = any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->so.api_key, "require \"Authorization: Bearer KEY\" on /v1/* (default: $K3_API_KEY)");
  cmd->add_option("--served-model-name", o->served_name, "model name of the API (default: the model directory's name)");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "sequences the engine runs at once")->capture_default_str();
  cmd->add_option("--max-waiting", o->so.max_waiting, "requests that may wait beyond --max-num-seqs; more get 429")
      ->capture_default_str();
  cmd->add_option("--max-model-len", o->max_model_len, "prompt + completion tokens per sequence (default: 4096)");
  cmd->add_option("--max-body-bytes", o->so.max_body_bytes, "largest request body (413 beyond)")->capture_default_str();
  cmd->add_option("--threads", o->so.threads, "HTTP I/O threads")->capture_default_str()->check(CLI::Range(1, 64));
  cmd->add_option("--timeout", o->so.read_timeout_s, "seconds to receive a request (and keep-alive idle time)")
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", o->so.shutdown_grace_s, "seconds in-flight requests may finish after SIGTERM")
      ->capture_default_str();
  cmd->add_flag("--log-requests", o->so.log_requests, "log one line per request to stderr");
  cmd->callback([&reg, o] {
    reg.action = [o] {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string dir = resolve_model_dir(o->model);
      auto model = k3::Model::load(dir);
      auto tok = k3::text::Tokenizer::load(dir);
      const auto& cfg = model->config();
      if (tok.n_vocab() > cfg.vocab_size)
        throw k3::Error("the tokenizer has " + std::to_string(tok.n_vocab()) + " ids but the model's vocab_size is " +
                        std::to_string(cfg.vocab_size));
      const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

      k3::engine::SerialEngineOptions eo;
      eo.max_model_len = o->max_model_len > 0 ? o->max_model_len : 4096;
      eo.max_num_seqs = o->max_num_seqs;
      k3::engine::SerialEngine engine(*model, tok, eo);

      const int32_t bos = static_cast<int32_t>(cfg.bos_token_id >= 0 ? cfg.bos_token_id : tok.bos_id());
      k3::serve::ModelChatAdapterOptions co;
      co.bos = bos;  // k3-tiny was trained on [BOS] + XTML documents
      if (cfg.eos_token_id >= 0) co.extra_stop.push_back(static_cast<int32_t>(cfg.eos_token_id));
      auto chat = k3::serve::make_model_chat_adapter(cfg.model_type, tok, co);
      k3::serve::ApiContext ctx;
      ctx.model_name = !o->served_name.empty()
                           ? o->served_name
                           : std::filesystem::path(dir).lexically_normal().filename().string();
      if (ctx.model_name.empty()) ctx.model_name = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
      ctx.tok = &tok;
      ctx.chat = chat.get();
      ctx.bos = bos;
      ctx.max_model_len = eo.max_model_len;
      ctx.vocab_size = cfg.vocab_size;
      if (o->so.api_key.empty())
        if (const char* k = std::getenv("K3_API_KEY")) o->so.api_key = k;

      k3::serve::Metrics metrics;
      k3::serve::Server server(o->so, engine, ctx, metrics);
      server.start();
      const double ready_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr,
                   "k3 serve: model '%s' from %s (load %.3f s); ready in %.3f s on http://%s:%u "
                   "(max_model_len %lld, %d I/O threads%s)\n",
                   ctx.model_name.c_str(), dir.c_str(), load_s, ready_s, o->so.host.c_str(), server.port(),
                   (long long)eo.max_model_len, o->so.threads, o->so.api_key.empty() ? "" : ", API key required");
      std::fflush(stderr);
      server.run_until_signal();
      std::fprintf(stderr, "k3 serve: stopped\n");
      return 0;
    };
  });
}

}  // namespace k3cli
