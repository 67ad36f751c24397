#include "cli/commands.h"

namespace k3cli {

void add_info(CLI::App&, Registry&);
void add_logits(CLI::App&, Registry&);
void add_run(CLI::App&, Registry&);
void add_tokenize(CLI::App&, Registry&);
void add_perplexity(CLI::App&, Registry&);
void add_serve(CLI::App&, Registry&);
void add_bench(CLI::App&, Registry&);
void add_plan(CLI::App&, Registry&);

std::vector<AddCommand> all_commands() {
  return {add_run, add_serve, add_bench, add_plan, add_perplexity, add_logits, add_tokenize, add_info};
}

}  // namespace k3cli
