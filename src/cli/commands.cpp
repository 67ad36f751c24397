#include "cli/commands.h"

namespace k3cli {

void add_info(CLI::App&, Registry&);
void add_logits(CLI::App&, Registry&);

std::vector<AddCommand> all_commands() { return {add_info, add_logits}; }

}  // namespace k3cli
