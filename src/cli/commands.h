// Registration of CLI verbs. Each cmd_*.cpp defines one `void add_<verb>(CLI::App&, Registry&)`
// that adds a subcommand and sets the callback the Registry runs after parsing.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace k3cli {

struct Registry {
  std::function<int()> action;
  int run() { return action ? action() : 0; }
};

using AddCommand = void (*)(CLI::App&, Registry&);
std::vector<AddCommand> all_commands();
// The raw command line, stored in bench results.
void set_bench_cmdline(int argc, char** argv);

}  // namespace k3cli

namespace k3cli {
// A check for floating-point options: CLI11's numeric checks (PositiveNumber, Range) pass NaN (every
// comparison with it is false), and "nan" / "inf" parse as doubles. Chain it before them.
CLI::Validator finite_number();
}  // namespace k3cli
