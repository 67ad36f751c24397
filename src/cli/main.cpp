// The `k3` binary: a thin front end over libk3, one file per verb (cmd_*.cpp).

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "cli/commands.h"
#include "k3/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"k3.cpp: inference engine for the Kimi K3 model family"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "k3.cpp 0.1.0");
  k3cli::set_bench_cmdline(argc, argv);
  k3cli::Registry reg;
  for (auto& add : k3cli::all_commands()) add(app, reg);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return reg.run();
  } catch (const k3::Error& e) {
    std::fprintf(stderr, "k3: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3: internal error: %s\n", e.what());
    return 2;
  }
}
