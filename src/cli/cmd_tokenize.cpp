// `k3 tokenize [-m DIR|GGUF] [--special]` reads UTF-8 text on stdin and prints a JSON array of ids
// (encode_ordinary unless --special). `--decode` reads a JSON array of ids and prints the text.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_loader.h"
#include "k3/core/error.h"
#include "k3/io/json_depth.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

// The ids of `--decode`: a JSON array of integers in 0..n_vocab-1. nlohmann's get<int32_t> would
// silently wrap 4294967361 to 65, truncate 1.5 to 1 and accept -1, so each element is checked.
std::vector<int32_t> parse_decode_ids(const std::string& in, int32_t n_vocab) {
  k3::check_json_depth(in, "--decode input");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw k3::Error(std::string("--decode expects a JSON array of integer ids: ") + e.what());
  }
  if (!j.is_array()) throw k3::Error("--decode expects a JSON array of integer ids, got " + std::string(j.type_name()));
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& v = j[i];
    const bool in_range = (v.is_number_unsigned() && v.get<uint64_t>() < static_cast<uint64_t>(n_vocab)) ||
                          (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < n_vocab);
    if (!in_range)
      throw k3::Error("--decode: element " + std::to_string(i) + " (" + v.dump().substr(0, 40) +
                      ") is not a token id in 0.." + std::to_string(n_vocab - 1));
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

void add_tokenize(CLI::App& app, Registry& reg) {
  struct Opts {
    std::string model;
    bool special = false, decode = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("tokenize", "Text on stdin -> JSON ids on stdout (or back with --decode)");
  cmd->add_option("-m,--model", o->model,
                  "HF directory with tiktoken.model and tokenizer_config.json, or a GGUF file (its vocabulary, as "
                  "`k3 run` reads it; default: the built-in model)");
  cmd->add_flag("--special", o->special, "map special-token text to special ids");
  cmd->add_flag("--decode", o->decode, "read a JSON array of ids and print the decoded text");
  cmd->callback([&reg, o] {
    reg.action = [o] {
      auto tok = load_tokenizer(resolve_model_dir(o->model), DeviceOptions{});
      std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
      if (o->decode) {
        const std::vector<int32_t> ids = parse_decode_ids(in, tok.n_vocab());
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
