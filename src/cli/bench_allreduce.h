// `k3 bench allreduce`: the all-reduce cost between the ranks of a tensor-parallel group (MPI between CPU
// processes), nccl-tests style, written so that `k3 plan --measured FILE` reads it.
#pragma once
#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace k3cli {
void add_bench_allreduce(CLI::App* bench, Registry& reg);
}
