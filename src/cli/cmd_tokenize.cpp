// `k3 tokenize [-m DIR] [--special]` reads UTF-8 text on stdin and prints a JSON array of ids
// (encode_ordinary unless --special). `--decode` reads a JSON array of ids and prints the text.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "k3/core/error.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

void add_tokenize(CLI::App& app, Registry& reg) {
  struct Opts {
    std::string model;
    bool special = false, decode = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("tokenize", "Text on stdin -> JSON ids on stdout (or back with --decode)");
  cmd->add_option("-m,--model", o->model, "directory with tiktoken.model and tokenizer_config.json");
  cmd->add_flag("--special", o->special, "map special-token text to special ids");
  cmd->add_flag("--decode", o->decode, "read a JSON array of ids and print the decoded text");
  cmd->callback([&reg, o] {
    reg.action = [o] {
      auto tok = k3::text::Tokenizer::load(resolve_model_dir(o->model));
      std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
      if (o->decode) {
        std::vector<int32_t> ids;
        try {
          ids = nlohmann::json::parse(in).get<std::vector<int32_t>>();
        } catch (const nlohmann::json::exception& e) {
          throw k3::Error(std::string("--decode expects a JSON array of integer ids: ") + e.what());
        }
        const std::string text = tok.decode(ids);
        std::fwrite(text.data(), 1, text.size(), stdout);
      } else {
        std::printf("%s\n", nlohmann::json(tok.encode(in, o->special)).dump().c_str());
      }
      return 0;
    };
  });
}

}  // namespace k3cli
