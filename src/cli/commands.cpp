#include "cli/commands.h"
#include <cmath>
#include <stdexcept>
#include <string>

namespace k3cli {

void add_info(CLI::App&, Registry&);
void add_logits(CLI::App&, Registry&);
void add_convert(CLI::App&, Registry&);
void add_run(CLI::App&, Registry&);
void add_chat(CLI::App&, Registry&);
void add_tokenize(CLI::App&, Registry&);
void add_perplexity(CLI::App&, Registry&);
void add_serve(CLI::App&, Registry&);
void add_bench(CLI::App&, Registry&);
void add_plan(CLI::App&, Registry&);
void add_prune(CLI::App&, Registry&);
void add_imatrix(CLI::App&, Registry&);
void add_quantize(CLI::App&, Registry&);

std::vector<AddCommand> all_commands() {
  return {add_run, add_chat, add_serve, add_bench, add_plan, add_perplexity, add_prune, add_imatrix, add_logits, add_tokenize, add_info, add_convert, add_quantize};
}

}  // namespace k3cli

namespace k3cli {
CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          size_t used = 0;
          const double v = std::stod(s, &used);
          if (used != s.size()) return "not a number: " + s;
          return std::isfinite(v) ? std::string() : "must be a finite number, got " + s;
        } catch (const std::exception&) {
          return "not a number: " + s;
        }
      },
      "FINITE");
}
}  // namespace k3cli
