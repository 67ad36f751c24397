// `k3 plan`: will a model fit on N GPUs of a kind, how many sequences, how fast at best, at what
// cost. Needs only a config (-m DIR or --preset); formulas in docs/planning.md.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "k3/core/cache_dtype.h"
#include "cli/common.h"
#include "k3/core/error.h"
#include "k3/plan/offload_plan.h"
#include "k3/plan/plan.h"

namespace k3cli {

namespace {

struct PlanOpts {
  std::string model, preset, gpu, kv_dtype = "bf16", state_dtype = "fp32", measured, hardware_file;
  int count = 8, tp = 0, ep = 0;
  int64_t context = 8192, chunk = 8192, batch = 0;
  double price = -1, mem_util = 0.90, mem_gb = 0, mem_bw = 0, tflops = 0;
  bool json = false, list = false;
  // one GPU + host RAM + disk (--host): see offload_plan.h
  std::string host;
  double ram_gb = 0, ram_bw = 0, cpu_tflops = 0, pcie_gb_s = 0, disk_gb_s = 0, ram_util = 0.85, hit_rate = -1;
  bool count_given = false, batch_given = false;
};

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw k3::Error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

k3::ModelConfig plan_config(const PlanOpts& o) {
  return o.preset.empty() ? k3::load_model_config(resolve_model_dir(o.model)) : k3::plan::load_preset(o.preset);
}

// --host: one GPU (or none) + the host's RAM + the checkpoint's disk.
int run_offload_plan(const PlanOpts& o, const std::vector<k3::plan::Hardware>& table) {
  if (o.count_given && o.count != 1) throw k3::Error("--host plans one GPU plus the host (--count 1); several GPUs: plan without --host");
  k3::plan::OffloadInput in;
  in.config = plan_config(o);
  in.host = k3::plan::find_host(o.hardware_file.empty() ? k3::plan::builtin_hosts()
                                                        : k3::plan::parse_hosts(read_text(o.hardware_file), o.hardware_file),
                                o.host);
  if (!o.gpu.empty() && o.gpu != "cpu" && o.gpu != "none") {
    in.gpu = k3::plan::find_hardware(table, o.gpu);
    if (o.mem_gb > 0) in.gpu->memory_gb = o.mem_gb;
    if (o.mem_bw > 0) in.gpu->hbm_tb_s = o.mem_bw;
    if (o.tflops > 0) in.gpu->bf16_tflops = o.tflops;
  }
  bool overridden = false;
  auto set = [&](double v, double& field) { if (v > 0) field = v, overridden = true; };
  set(o.ram_gb, in.host.ram_gb);
  set(o.ram_bw, in.host.dram_gb_s);
  set(o.cpu_tflops, in.host.cpu_tflops);
  set(o.pcie_gb_s, in.host.pcie_gb_s);
  set(o.disk_gb_s, in.host.disk_gb_s);
  if (overridden) in.host.source += " [overridden on the command line]";
  in.context = o.context;
  in.batch = o.batch_given ? o.batch : 1;
  in.prefill_chunk = o.chunk;
  in.kv_dtype = k3::parse_kv_cache_dtype(o.kv_dtype);
  in.state_dtype = k3::parse_mamba_ssm_cache_dtype(o.state_dtype);
  in.mem_util = o.mem_util;
  in.ram_util = o.ram_util;
  if (o.hit_rate >= 0) in.expert_hit_rate = o.hit_rate;
  const auto plan = k3::plan::make_offload_plan(in);
  if (o.json) std::printf("%s\n", k3::plan::offload_to_json(plan).dump(2).c_str());
  else std::fputs(k3::plan::format_offload_table(plan).c_str(), stdout);
  return 0;
}

int run_plan(const PlanOpts& o) {
  const std::vector<k3::plan::Hardware> table =
      o.hardware_file.empty() ? k3::plan::builtin_hardware() : k3::plan::parse_hardware(read_text(o.hardware_file), o.hardware_file);
  if (o.list) {
    std::printf("%-10s %-50s %7s %7s %8s %8s %8s\n", "gpu", "name", "mem GB", "TB/s", "bf16 TF", "fp8 TF", "fp4 TF");
    for (auto& h : table)
      std::printf("%-10s %-50s %7.0f %7.2f %8.0f %8.0f %8.0f\n", h.key.c_str(), h.name.c_str(), h.memory_gb, h.hbm_tb_s,
                  h.bf16_tflops, h.fp8_tflops.value_or(0), h.fp4_tflops.value_or(0));
    std::printf("\n%-14s %-46s %7s %8s %8s %8s %8s\n", "host", "name", "RAM GB", "DRAM GB/s", "CPU TF", "PCIe GB/s", "disk GB/s");
    for (auto& h : k3::plan::builtin_hosts())
      std::printf("%-14s %-46.46s %7.0f %8.1f %8.1f %8.1f %8.1f\n", h.key.c_str(), h.name.c_str(), h.ram_gb, h.dram_gb_s,
                  h.cpu_tflops, h.pcie_gb_s, h.disk_gb_s);
    std::printf("presets:");
    for (auto& n : k3::plan::preset_names()) std::printf(" %s", n.c_str());
    std::printf("\n");
    return 0;
  }
  if (!o.model.empty() && !o.preset.empty()) throw k3::Error("pass either -m DIR or --preset NAME, not both");
  if (!o.host.empty()) return run_offload_plan(o, table);
  if (o.gpu.empty()) throw k3::Error("--gpu is required (k3 plan --list shows the known devices)");

  k3::plan::PlanInput in;
  in.config = plan_config(o);
  in.hw = k3::plan::find_hardware(table, o.gpu);
  if (o.mem_gb > 0) in.hw.memory_gb = o.mem_gb;
  if (o.mem_bw > 0) in.hw.hbm_tb_s = o.mem_bw;
  if (o.tflops > 0) in.hw.bf16_tflops = o.tflops, in.hw.fp8_tflops.reset(), in.hw.fp4_tflops.reset();
  if (o.mem_gb > 0 || o.mem_bw > 0 || o.tflops > 0) in.hw.source += " [overridden on the command line]";
  in.count = o.count;
  in.tp = o.tp;
  in.ep = o.ep;
  in.context = o.context;
  in.kv_dtype = k3::parse_kv_cache_dtype(o.kv_dtype);
  in.state_dtype = k3::parse_mamba_ssm_cache_dtype(o.state_dtype);
  in.mem_util = o.mem_util;
  in.prefill_chunk = o.chunk;
  in.batch = o.batch;
  if (o.price >= 0) in.price_per_gpu_hour = o.price;
  if (!o.measured.empty()) {
    const k3::plan::Measured m = k3::plan::read_measured(read_text(o.measured), o.measured);
    in.measured_tokens_per_s = m.tokens_per_s;
    in.allreduce_latency_us = m.allreduce_latency_us;
    in.allreduce_busbw_gb_s = m.allreduce_busbw_gb_s;
    in.measured_source = o.measured;
  }
  const auto plan = k3::plan::make_plan(in);
  if (o.json) std::printf("%s\n", k3::plan::to_json(plan).dump(2).c_str());
  else std::fputs(k3::plan::format_table(plan).c_str(), stdout);
  return 0;  // also when it does not fit: the verdict is in the output
}

}  // namespace

void add_plan(CLI::App& app, Registry& reg) {
  auto* cmd = app.add_subcommand("plan", "Plan a deployment: memory, capacity, speed bounds and cost per GPU kind and count");
  auto o = std::make_shared<PlanOpts>();
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory (only config.json is read)");
  cmd->add_option("--preset", o->preset, "built-in config: kimi-k3 | kimi-linear-48b");
  cmd->add_option("--gpu", o->gpu, "device: h200 | h100 | b200 | b300 | gb300 | a100-80g | cpu (see --list)");
  auto* count = cmd->add_option("--count", o->count, "number of devices")->check(CLI::PositiveNumber);
  cmd->add_option("--tp", o->tp, "tensor-parallel size for attention/dense/shared/embeddings (default: --count)")->check(CLI::PositiveNumber);
  cmd->add_option("--ep", o->ep, "expert-parallel size for routed experts (default: --count)")->check(CLI::PositiveNumber);
  cmd->add_option("--context", o->context, "tokens per sequence (prompt + output)")->check(CLI::PositiveNumber);
  cmd->add_option("--kv-cache-dtype,--kv-dtype", o->kv_dtype,
                  "MLA latent cache dtype: bf16, fp8 (e4m3 + per-token scale), float32 (`auto` = float32, as k3 serve)")
      ->capture_default_str();
  cmd->add_option("--mamba-ssm-cache-dtype,--state-dtype", o->state_dtype, "KDA state dtype: float32, bfloat16")
      ->capture_default_str();
  cmd->add_option("--price-per-gpu-hour", o->price, "USD per device-hour (default: the hardware table's illustrative rate)")->check(finite_number())
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--measured", o->measured,
                  "a measured result JSON: its aggregate output tok/s (a `k3 bench` result) sets the cost; "
                  "allreduce_latency_us / allreduce_busbw_gb_s replace the assumed TP all-reduce costs");
  auto* batch = cmd->add_option("--batch", o->batch, "concurrent sequences for the aggregate decode bound (default: the most that fit)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--mem-util", o->mem_util, "fraction of device memory the engine may use")->check(finite_number())->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--chunk", o->chunk, "prefill chunk tokens (sizes the activation workspace)")->check(CLI::PositiveNumber);
  cmd->add_option("--mem-gb", o->mem_gb, "override device memory, GB (e.g. for --gpu cpu)")->check(finite_number())->check(CLI::PositiveNumber);
  cmd->add_option("--mem-bw", o->mem_bw, "override memory bandwidth, TB/s")->check(finite_number())->check(CLI::PositiveNumber);
  cmd->add_option("--tflops", o->tflops, "override dense compute, TFLOP/s (used for all dtypes)")->check(finite_number())->check(CLI::PositiveNumber);
  cmd->add_option("--hardware", o->hardware_file, "hardware table JSON instead of the built-in resources/hardware.json");
  cmd->add_flag("--json", o->json, "print JSON instead of the table");
  cmd->add_flag("--list", o->list, "list the known devices, hosts and presets");
  cmd->add_option("--host", o->host, "plan one GPU (--gpu, or none for CPU only) + this host's RAM + disk: epyc-9654-2s | xeon-8480-2s | ryzen-7950x (see --list)");
  cmd->add_option("--ram-gb", o->ram_gb, "with --host: override installed RAM, GB")->check(finite_number())->check(CLI::PositiveNumber);
  cmd->add_option("--ram-bw", o->ram_bw, "with --host: override DRAM read bandwidth, GB/s")->check(finite_number())->check(CLI::PositiveNumber);
  cmd->add_option("--cpu-tflops", o->cpu_tflops, "with --host: override the CPU's matmul rate, TFLOP/s")->check(finite_number())->check(CLI::PositiveNumber);
  cmd->add_option("--pcie-gb-s", o->pcie_gb_s, "with --host: override host-GPU PCIe bandwidth per direction, GB/s")->check(finite_number())->check(CLI::PositiveNumber);
  cmd->add_option("--disk-gb-s", o->disk_gb_s, "with --host: override the checkpoint drive's read bandwidth, GB/s")->check(finite_number())->check(CLI::PositiveNumber);
  cmd->add_option("--ram-util", o->ram_util, "with --host: fraction of RAM for weights and caches")->check(finite_number())->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--expert-hit-rate", o->hit_rate, "with --host: measured share of host expert reads served from RAM (default: uniform routing)")->check(finite_number())
      ->check(CLI::Range(0.0, 1.0));
  cmd->callback([&reg, o, count, batch] {
    o->count_given = count->count() > 0;
    o->batch_given = batch->count() > 0;
    reg.action = [o] { return run_plan(*o); };
  });
}

}  // namespace k3cli
