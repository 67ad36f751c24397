// The `k3` binary: a thin front end over libk3, one file per verb (cmd_*.cpp).

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/usage_hints.h"
#include "k3/backend/cpu/cpu_isa.h"
#include "k3/core/crash_report.h"
#include "k3/core/error.h"

int main(int argc, char** argv) {
  k3::install_crash_report();
  CLI::App app{"k3.cpp: inference engine for the Kimi K3 model family"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "k3.cpp " K3_VERSION);
  k3cli::set_bench_cmdline(argc, argv);
  k3cli::Registry reg;
  for (auto& add : k3cli::all_commands()) add(app, reg);
  // Two-letter short flags, which CLI11 cannot declare: llama.cpp's -ot X is --override-tensor X, vLLM's
  // -dp D is --data-parallel-size D.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::string& a : args) {
    if (a == "-ot") a = "--override-tensor";
    if (a == "-dp") a = "--data-parallel-size";
  }
  const std::vector<std::string> in_order = args;
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Exit codes (README): 0 done, 1 error, 2 command-line usage error, 3 internal error.
    const std::string hint = k3cli::usage_hint(app, in_order);
    std::fprintf(stderr, "k3: usage error: %s%s\nRun with --help for more information.\n", e.what(),
                 hint.empty() ? "" : (" (" + hint + ")").c_str());
    return 2;
  }
  try {
    // The CPU kernel tier, chosen once at start-up (the baseline was checked before main:
    // cpu_baseline_check.cpp); a bad $K3_CPU_ISA is an error here, whatever the verb.
    k3::cpu::cpu_state();
    return reg.run();
  } catch (const k3::Error& e) {
    std::fprintf(stderr, "k3: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3: internal error: %s\n", e.what());
    return 3;
  }
}
