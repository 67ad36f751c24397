// "Did you mean ...?" for a command line CLI11 refused: the verb or flag nearest to what was typed.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace k3cli {

// For each argument that is neither a known verb (first position) nor a known flag of the chosen verb, the
// nearest known one within a small edit distance: "did you mean 'run'?" / "did you mean '--temp'?"; "" when
// nothing is close. `args` in command-line order (without argv[0]).
std::string usage_hint(CLI::App& app, const std::vector<std::string>& args);

}  // namespace k3cli
