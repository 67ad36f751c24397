#include "cli/model_loader.h"

#include "k3/core/thread_pool.h"
#include "cli/commands.h"
#include "k3/io/mapped_file.h"
#include "k3/text/gguf_vocab.h"

#include "k3/core/cache_dtype.h"
#include "k3/core/error.h"
#include "k3/core/moe_activation.h"
#include "k3/core/thread_pool.h"
#include "k3/model/config.h"
#include "k3/model/gguf_model.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <vector>
#include <cstdlib>
#include <filesystem>
#include "k3/dist/communicator.h"
#include "k3/dist/gpu_placement.h"
#include "k3/dist/rendezvous.h"
#include "k3/dist/launcher.h"
#include "k3/dist/tp_model.h"
#include "k3/model/dummy_checkpoint.h"
#include "k3/model/model.h"
#include "k3/plan/plan.h"
#ifdef K3_HAVE_CUDA
#include "k3/backend/cuda/cuda_model.h"
#include "k3/backend/cuda/cuda_rank_device.h"
#endif

namespace k3cli {

void add_device_options(CLI::App* cmd, DeviceOptions& d) {
  cmd->add_option("--device", d.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--load-format", d.load_format,
                  "auto (the checkpoint's safetensors) or dummy (random weights from config.json alone, "
                  "to benchmark real shapes without a checkpoint: on the GPU drawn there, on the CPU and under "
                  "--tensor-parallel-size views of shared random pools, model/dummy_checkpoint.h)")
      ->check(CLI::IsMember({"auto", "dummy"}))
      ->capture_default_str();
  cmd->add_option("--preset", d.preset, "with --load-format dummy: a built-in config (kimi-k3, kimi-linear-48b-a3b)");
  cmd->add_option("--gemm-precision", d.gemm,
                  "cuda: prefill projections on the tensor cores with activations split into two bf16 parts "
                  "(bf16x2, matches the fp32 CPU reference) or rounded to bf16 (bf16, faster)")
      ->check(CLI::IsMember({"bf16x2", "bf16"}))
      ->capture_default_str();
  cmd->add_flag("--enforce-eager", d.enforce_eager, "cuda: launch every kernel of a decode step (no CUDA graphs)");
  cmd->add_option("--num-layers", d.num_layers, "with --load-format dummy: keep only the first N layers")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_option("--kv-cache-dtype", d.kv_cache_dtype,
                  "MLA latent cache: auto (float32), float32, bf16, fp8 (e4m3 with a per-token scale; docs/cache-dtypes.md)")
      ->capture_default_str();
  cmd->add_option("--mamba-ssm-cache-dtype", d.mamba_ssm_cache_dtype,
                  "KDA recurrent state: auto (float32), float32, bfloat16 (rounded after every token; once per chunk in "
                  "the chunked prefill form)")
      ->capture_default_str();
  cmd->add_option("--moe-activation-dtype", d.moe_activation_dtype,
                  "the routed experts' activations: float32, or mxfp8 (each token's expert input and GLU output "
                  "rounded to MXFP8, E4M3 in blocks of 32 with a power-of-two scale: the numerics K3 was trained with), "
                  "or q8 (int8 in blocks of 32 with a float scale, llama.cpp's q8 class; the CPU backend only; "
                  "docs/quantization.md)")
      ->check(CLI::IsMember({"float32", "mxfp8", "q8"}))
      ->capture_default_str();
  cmd->add_option("--override-tensor", d.override_tensor,
                  "PATTERN=DEVICE: matrices whose checkpoint name matches the PCRE2 pattern live on DEVICE (CPU, CUDA0); "
                  "repeatable (-ot for short), first match wins (e.g. -ot 'experts\\.=CPU')")
      ->expected(1)
      ->allow_extra_args(false)  // one rule per flag: CLI11 would split a "[...]" value on commas
      ->each([](const std::string&) {});
  add_compute_options(cmd, d.compute);
  cmd->add_option("--expert-cache-gb", d.expert_cache_gb,
                  "cpu, or cuda with --cpu-moe / -ot on the host: GB of the most used routed experts kept resident (mlock) when the checkpoint is bigger than "
                  "RAM; -1: automatic (half the available memory less the other weights, 0 when the model fits), 0: "
                  "none pinned")
      ->check(finite_number())
      ->check(CLI::Range(-1.0, 1e6))
      ->capture_default_str();
  cmd->add_option("--expert-prefetch", d.expert_prefetch,
                  "cpu (and host-placed experts): read the routed experts a step needs as soon as routing is known: threads (reader threads "
                  "fault them in), madvise (MADV_WILLNEED), none")
      ->check(CLI::IsMember({"none", "madvise", "threads"}))
      ->capture_default_str();
  cmd->add_flag("--no-expert-residency", d.no_expert_residency,
                "cpu: no expert hit counting, prefetch or pinning (the page cache alone)");
  cmd->add_flag("--no-mmap", d.no_mmap,
                "read the model files into memory instead of mapping them (llama.cpp's flag): the whole model in RAM up "
                "front, no expert residency; faster CPU decode where mapped pages stream slower (docs/perf/cpu.md)");
  cmd->add_flag("--no-repack", d.no_repack,
                "cpu: keep the MXFP4 routed experts as stored, without their repacked copies (llama.cpp's flag; the copies "
                "cost the experts' bytes again in RAM for ~1.1-2x faster expert products; made only where they take at "
                "most half the free memory, backend/cpu/mxfp4_rowblocks.h)");
  cmd->add_option("--tokenizer", d.tokenizer,
                  "directory with tiktoken.model and tokenizer_config.json (default: the model's; for a GGUF file, "
                  "the directory it is in)");
  cmd->add_option("--tensor-parallel-size,--tp", d.tensor_parallel_size,
                  "cpu: shard the model over N processes: those of `mpirun -np N`, else k3 starts N - 1 workers itself (heads, MLP columns, vocabulary; "
                  "docs/multi-gpu.md)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--nnodes", d.nnodes, "hosts of a --tensor-parallel-size group (one rank each; docs/multi-gpu.md)")
      ->capture_default_str();
  cmd->add_option("--node-rank", d.node_rank, "this host's place in the group, 0..nnodes-1 (0 also serves)")
      ->capture_default_str();
  cmd->add_option("--master-addr", d.master_addr, "node 0's address, where the other nodes meet it")->capture_default_str();
  cmd->add_option("--master-port", d.master_port, "node 0's TCP port for the rendezvous")->capture_default_str();
  cmd->add_flag("--enable-expert-parallel", d.enable_expert_parallel,
                "with --tensor-parallel-size: each rank owns whole routed experts (a block of them) instead of a slice "
                "of every expert");
  cmd->add_flag("--ep-all-to-all", d.ep_all_to_all,
                "with --enable-expert-parallel: each rank sends its share of the tokens to the ranks owning their "
                "experts and gets the results back (all-to-all), instead of every rank routing every token");
  cmd->add_option("--expert-placement", d.expert_placement,
                  "with --enable-expert-parallel: the experts in rank order, a permutation of 0..E-1 as a comma "
                  "list (rank r holds the r-th balanced block of it; default: 0,1,2,...)");
  cmd->add_flag("--cpu-moe", d.cpu_moe, "keep every routed expert on the CPU (the rest on the GPU)");
  cmd->add_option("--n-cpu-moe", d.n_cpu_moe, "keep the routed experts of the first N layers on the CPU")
      ->check(CLI::Range(0, 100000));
}

k3::text::Tokenizer load_tokenizer(const std::string& model_path, const DeviceOptions& d) {
  if (!d.tokenizer.empty()) return k3::text::Tokenizer::load(d.tokenizer);
  if (!k3::is_gguf_path(model_path)) return k3::text::Tokenizer::load(model_path);
  const std::filesystem::path beside = std::filesystem::absolute(model_path).parent_path();
  std::error_code ec;
  if (std::filesystem::exists(beside / "tiktoken.model", ec)) return k3::text::Tokenizer::load(beside.string());
  const k3::GgufFile f(model_path);
  if (!f.gguf().metadata.contains("tokenizer.ggml.tokens"))
    throw k3::Error("'" + model_path + "' has no tokenizer (no tokenizer.ggml.tokens) and no tiktoken.model beside it: "
                    "pass --tokenizer DIR (a directory with tiktoken.model and tokenizer_config.json)");
  return k3::text::tokenizer_from_gguf(f.gguf(), model_path);
}

k3::ModelConfig dummy_config(const std::string& dir, const DeviceOptions& d) {
  k3::ModelConfig cfg = d.preset.empty() ? k3::load_model_config(dir) : k3::plan::load_preset(d.preset);
  if (d.num_layers > 0 && d.num_layers < cfg.num_layers) {
    cfg.num_layers = d.num_layers;
    cfg.is_kda.resize(static_cast<size_t>(d.num_layers));
    // An Attention Residuals block longer than the cut model is one block of all its layers (boundaries are the
    // layers l % size == 0): the same model, and a config that validates (a GGUF written from it is read again).
    cfg.attn_res_block_size = std::min(cfg.attn_res_block_size, cfg.num_layers);
  }
  return cfg;
}

namespace {

// --expert-placement "3,0,2,1": the numbers (make_shard_plan checks that they are a permutation).
std::vector<int32_t> parse_expert_placement(const std::string& list) {
  std::vector<int32_t> out;
  size_t at = 0;
  while (at < list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, comma - at);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > (1 << 20))
      throw k3::Error("--expert-placement: '" + item + "' is not an expert number");
    out.push_back(static_cast<int32_t>(v));
    at = comma + 1;
  }
  return out;
}

// --nnodes & co., checked (before anything starts).
k3::dist::RendezvousOptions rendezvous_options(const DeviceOptions& d) {
  k3::dist::RendezvousOptions o;
  o.nnodes = d.nnodes;
  o.node_rank = d.node_rank;
  o.master_addr = d.master_addr;
  o.master_port = d.master_port;
  k3::dist::validate(o);
  if (o.nnodes > 1) {
    if (d.tensor_parallel_size == 1)
      throw k3::Error("--nnodes " + std::to_string(o.nnodes) + " needs --tensor-parallel-size (a multiple of it)");
    if (k3::dist::launched_by_mpi())
      throw k3::Error("--nnodes starts the group through its own rendezvous: not under mpirun (use one or the other)");
    if (d.tensor_parallel_size % o.nnodes != 0)
      throw k3::Error("--tensor-parallel-size " + std::to_string(d.tensor_parallel_size) + " is not a multiple of --nnodes " +
                      std::to_string(o.nnodes));
    o.ranks_per_node = d.tensor_parallel_size / o.nnodes;
  }
  return o;
}

bool is_cuda_device(const std::string& device) { return device == "cuda" || device.rfind("cuda:", 0) == 0; }

// cuda -> 0, cuda:N -> N.
int parse_cuda_ordinal(const std::string& device) {
  if (device.size() <= 5) return 0;
  try {
    size_t used = 0;
    const int ordinal = std::stoi(device.substr(5), &used);
    if (used != device.size() - 5 || ordinal < 0) throw std::invalid_argument("");
    return ordinal;
  } catch (const std::exception&) {
    throw k3::Error("--device '" + device + "': expected cuda:N with N a GPU index");
  }
}

// --expert-cache-gb, --expert-prefetch, --no-expert-residency: the routed experts on the host, CPU or hybrid.
k3::ExpertResidencyOptions expert_residency_options(const DeviceOptions& d) {
  k3::ExpertResidencyOptions ex;
  ex.enabled = !d.no_expert_residency && !d.no_mmap;  // --no-mmap: every expert is in RAM already
  ex.prefetch = k3::parse_expert_prefetch(d.expert_prefetch);
  ex.hot_budget_bytes = d.expert_cache_gb < 0 ? k3::ExpertResidencyOptions::kAutoBudget
                                              : static_cast<int64_t>(d.expert_cache_gb * 1e9);
  return ex;
}

#ifdef K3_HAVE_CUDA
// This rank's place among the group's ranks on its host (by host name, whatever started them: mpirun,
// a spawning rank 0, a rendezvous): the GPU it takes and how many share it follow from that.
struct HostPlace {
  int local_rank = 0, local_size = 1;
};
HostPlace host_place(k3::dist::Communicator& comm) {
  char name[64] = {};
  ::gethostname(name, sizeof name - 1);
  std::vector<char> all(sizeof name * static_cast<size_t>(comm.size()));
  comm.all_gather(name, sizeof name, all.data());
  HostPlace p{0, 0};
  for (int r = 0; r < comm.size(); ++r) {
    if (std::strncmp(all.data() + sizeof name * static_cast<size_t>(r), name, sizeof name) != 0) continue;
    if (r < comm.rank()) ++p.local_rank;
    ++p.local_size;
  }
  return p;
}

k3::cuda::CudaLoadOptions cuda_load_options(const DeviceOptions& d, k3::CacheDType kv, k3::CacheDType ssm, int ordinal) {
  k3::cuda::CudaLoadOptions lo;
  lo.device = ordinal;
  lo.gemm_bf16 = d.gemm == "bf16";
  lo.enforce_eager = d.enforce_eager;
  lo.kv_cache_dtype = kv;
  lo.ssm_cache_dtype = ssm;
  lo.moe_activation = k3::parse_moe_activation_dtype(d.moe_activation_dtype);
  return lo;
}

// A GPU rank: the host's ranks take its GPUs round-robin from --device's ordinal; ranks sharing one GPU
// share its memory (and NCCL cannot connect them: their collectives go through host memory). Sets the home
// the shard's weights are bound to (that GPU).
k3::dist::RankDeviceFactory gpu_rank(k3::dist::Communicator& comm, const DeviceOptions& d, k3::CacheDType kv,
                                     k3::CacheDType ssm, int& weights_device) {
  const int ordinal = parse_cuda_ordinal(d.device), n = std::max(k3::cuda::visible_cuda_devices(), 1);
  const HostPlace hp = host_place(comm);
  const k3::dist::GpuPlace place = k3::dist::place_on_gpus(ordinal, hp.local_rank, hp.local_size, n);
  k3::cuda::CudaRankOptions ro;
  ro.load = cuda_load_options(d, kv, ssm, place.gpu);
  ro.ranks_on_device = place.ranks_on_gpu;
  ro.group_shares_a_gpu = k3::dist::group_shares_a_gpu(comm, k3::dist::host_shares_a_gpu(hp.local_size, n));
  weights_device = place.gpu;
  ro.collectives = k3::cuda::collectives_from_env();
  return k3::cuda::cuda_rank_device(ro);
}
#endif

// --tensor-parallel-size N under mpirun: this rank's shard. Ranks other than 0 never return.
std::unique_ptr<k3::ModelRunner> load_sharded(const std::string& dir, const DeviceOptions& d, k3::CacheDType kv,
                                              k3::CacheDType ssm, k3::MoeActivationDType moe_act,
                                              const k3::Placement& placement) {
  const bool gpu = is_cuda_device(d.device);
  if (d.device != "cpu" && !gpu) throw k3::Error("--device '" + d.device + "': expected cpu, cuda or cuda:N");
#ifndef K3_HAVE_CUDA
  if (gpu)
    throw k3::Error("--device " + d.device + ": this k3 was built without the CUDA backend "
                    "(configure with the `cuda` preset: cmake --preset cuda)");
#endif
  if (gpu) parse_cuda_ordinal(d.device);  // a malformed --device fails before any worker starts
  if (!placement.empty()) throw k3::Error("--tensor-parallel-size does not combine with --override-tensor or --cpu-moe");
  // Under mpirun (or started by a rank 0 that spawned us) the group exists; over several hosts it meets
  // at node 0's rendezvous; else this process is rank 0 and starts the other ranks itself on this host
  // (vLLM's behaviour).
  std::unique_ptr<k3::dist::Communicator> comm;
  if (d.nnodes > 1) {
    comm = k3::dist::join_mpi_nodes(rendezvous_options(d));
  } else {
    comm = k3::dist::launched_by_mpi() ? k3::dist::make_mpi_comm() : k3::dist::spawn_mpi_workers(d.tensor_parallel_size);
  }
  if (comm->size() != d.tensor_parallel_size)
    throw k3::Error("--tensor-parallel-size " + std::to_string(d.tensor_parallel_size) + " but mpirun started " +
                    std::to_string(comm->size()) + " processes (they must be equal)");
  k3::dist::TpLoadOptions opt;
  opt.expert_parallel = d.enable_expert_parallel;
  opt.placement.all_to_all = d.ep_all_to_all;
  opt.placement.expert_order = parse_expert_placement(d.expert_placement);
  opt.kv = kv;
  opt.ssm = ssm;
  opt.moe_activation = moe_act;
  if (d.load_format == "dummy") opt.dummy = dummy_config(dir, d);  // every rank draws the same random model
#ifdef K3_HAVE_CUDA
  if (gpu) opt.device = gpu_rank(*comm, d, kv, ssm, opt.weights_device);
#endif
  auto model = k3::dist::TpModel::load(dir, std::move(comm), opt);
  if (!model->comm().is_root()) {
    // Rank 0 alone decides when the job ends (SIGTERM / SIGINT drain its server, then it stops the
    // workers): a worker killed by the launcher's forwarded signal would leave rank 0 in a collective.
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
    std::signal(SIGPIPE, SIG_IGN);  // OpenMPI's runtime pipes closing when rank 0 exits are not a reason to die
    model->run_worker();
    model.reset();  // finalises MPI with the other ranks
    std::exit(0);
  }
  return model;
}

// A GPU with weights on the host (--cpu-moe, --n-cpu-moe, -ot PATTERN=CPU) and no thread count asked for
// (-t, $K3_NUM_THREADS, $OMP_NUM_THREADS): one CPU less than the process may use. The compute threads
// spin through each host expert job, so with one on every CPU the CUDA driver's and the OS's threads
// preempt one of them and the whole job waits for it: on the 16-core H200 host, hybrid decode went from
// 285-306 tok/s (+-3-8 between repetitions) with 16 threads to 311 (+-0.07) with 15
// (docs/perf/cuda/hybrid-s9-graphs.txt). llama.cpp's advice for GPU + CPU runs is the same.
ComputeOptions hybrid_compute_options(const DeviceOptions& d, const k3::Placement& placement) {
  ComputeOptions c = d.compute;
  if (c.threads || d.device == "cpu" || placement.empty() || !placement.only_host()) return c;
  std::string source;
  const int n = k3::ThreadPool::default_threads(&source);
  if (source == "K3_NUM_THREADS" || source == "OMP_NUM_THREADS" || n < 2) return c;
  c.threads = n - 1;
  c.threads_source = "the CPUs this process may use, less one for the GPU driver (weights on the host)";
  return c;
}

// One line when the CPU repacked the MXFP4 experts (llama.cpp says so of its repacked buffers too): what it costs.
void report_expert_copies(const k3::Model& m) {
  if (m.expert_copy_bytes() == 0) return;
  if (m.expert_released_bytes() > 0)  // the copies replace the stored experts' pages (decode_layout.h)
    std::fprintf(stderr, "k3: MXFP4 routed experts repacked for the CPU's products: %.2f GB, the stored experts' %.2f GB "
                 "of pages released (--no-repack keeps them as stored)\n",
                 static_cast<double>(m.expert_copy_bytes()) / 1e9, static_cast<double>(m.expert_released_bytes()) / 1e9);
  else  // stored bytes nothing releases (random weights in memory)
    std::fprintf(stderr, "k3: MXFP4 routed experts repacked for the CPU's products: %.2f GB more RAM (--no-repack: none)\n",
                 static_cast<double>(m.expert_copy_bytes()) / 1e9);
}

}  // namespace

DeviceOptions replica_device_options(const DeviceOptions& d, int i) {
  DeviceOptions r = d;
  r.apply_compute = d.apply_compute && i == 0;
#ifdef K3_HAVE_CUDA
  if (is_cuda_device(d.device)) {
    const int n = std::max(k3::cuda::visible_cuda_devices(), 1);  // the count the TP ranks' placement uses
    r.device = "cuda:" + std::to_string((parse_cuda_ordinal(d.device) + i) % n);
  }
#endif  // without the backend: the device as given, which load_model refuses by that name
  return r;
}

std::unique_ptr<k3::ModelRunner> load_model(const std::string& dir, const DeviceOptions& d) {
  // --no-mmap for this load's files only (a GGUF opened later for its vocabulary is mapped, not copied).
  struct FileLoadScope {
    explicit FileLoadScope(bool read) { k3::set_file_load(read ? k3::FileLoad::Read : k3::FileLoad::Mmap); }
    ~FileLoadScope() { k3::set_file_load(k3::FileLoad::Mmap); }
  } file_load_scope(d.no_mmap);
  auto placement = std::make_shared<k3::Placement>(k3::Placement::parse(d.override_tensor, d.cpu_moe, d.n_cpu_moe));
  if (d.apply_compute) apply_compute_options(hybrid_compute_options(d, *placement));
  const bool dummy = d.load_format == "dummy";
  const k3::CacheDType kv = k3::parse_kv_cache_dtype(d.kv_cache_dtype);
  const k3::CacheDType ssm = k3::parse_mamba_ssm_cache_dtype(d.mamba_ssm_cache_dtype);
  const k3::MoeActivationDType moe_act = k3::parse_moe_activation_dtype(d.moe_activation_dtype);
  if (!dummy && (!d.preset.empty() || d.num_layers > 0))
    throw k3::Error("--preset and --num-layers apply to --load-format dummy only");
  rendezvous_options(d);  // --nnodes & co. checked before anything starts
  if (!d.enable_expert_parallel && (d.ep_all_to_all || !d.expert_placement.empty()))
    throw k3::Error("--ep-all-to-all and --expert-placement apply with --enable-expert-parallel");
  parse_expert_placement(d.expert_placement);  // a malformed list fails before any worker starts
  if (d.tensor_parallel_size > 1) return load_sharded(dir, d, kv, ssm, moe_act, *placement);
  // N copies of one whole model (N servers on one port, N interleaved outputs) is never what was meant.
  if (const int world = k3::dist::launcher_world_size(); world > 1)
    throw k3::Error("started by mpirun as one of " + std::to_string(world) +
                    " processes without --tensor-parallel-size: pass --tensor-parallel-size " + std::to_string(world));
  if (d.device == "cpu") {
    if (!placement->only_host())
      throw k3::Error("--override-tensor: a rule places weights on a GPU, but --device cpu runs everything on the CPU");
    if (dummy) {  // random weights in host memory: no file, so no expert residency to manage
      k3::ExpertResidencyOptions none;
      none.enabled = false;
      auto m = k3::Model::load(k3::dummy_model_files(dummy_config(dir, d)), kv, ssm, none);
      m->set_moe_activation_dtype(moe_act);
      m->add_decode_layouts(!d.no_repack);
      report_expert_copies(*m);
      return m;
    }
    auto m = k3::Model::load(dir, kv, ssm, expert_residency_options(d));
    m->set_moe_activation_dtype(moe_act);
    m->add_decode_layouts(!d.no_repack);
    report_expert_copies(*m);
    return m;
  }
  if (is_cuda_device(d.device)) {
    const int ordinal = parse_cuda_ordinal(d.device);
#ifdef K3_HAVE_CUDA
    k3::cuda::CudaLoadOptions lo = cuda_load_options(d, kv, ssm, ordinal);
    if (!placement->empty()) {
      lo.placement = placement;
      lo.experts = expert_residency_options(d);
    }
    if (dummy) return k3::cuda::CudaModel::load_dummy(dummy_config(dir, d), lo);
    return k3::cuda::CudaModel::load(dir, lo);
#else
    (void)ordinal;
    throw k3::Error("--device " + d.device + ": this k3 was built without the CUDA backend "
                    "(configure with the `cuda` preset: cmake --preset cuda)");
#endif
  }
  throw k3::Error("--device '" + d.device + "': expected cpu, cuda or cuda:N");
}

}  // namespace k3cli
