// The `k3` binary's verbs as other tools call them: logits to .npy, tokenize round trips, info,
// and clear errors with a non-zero exit status for bad input.
#include <gtest/gtest.h>

#include <filesystem>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "k3/backend/cpu/mxfp4_rowblocks.h"
#include "k3/core/npy.h"
#include "golden_util.h"
#include "test_util.h"

namespace {

struct Result {
  int status;
  std::string out;
};

// Runs a shell command line, capturing stdout (stderr goes to the file `err` if given).
Result sh(const std::string& cmd) {
  Result r{0, ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string k3bin() { return std::string(K3_BINARY); }

std::string read(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A model dir holding only the real Kimi tokenizer (for `k3 tokenize`).
struct KimiTokenizerDir {
  k3test::TempDir d;
  KimiTokenizerDir() {
    k3test::fs::copy_file(k3test::shared_path("data/tokenizers/kimi/tiktoken.model"), d.path / "tiktoken.model");
    k3test::fs::copy_file(k3test::source_path("tests/data/tokenizer/k3_tokenizer_config.json"), d.path / "tokenizer_config.json");
  }
};

}  // namespace

TEST(Cli, LogitsPrefillAndDecodeMatchGoldens) {
  k3test::TempDir t;
  const std::string g = k3test::source_path("tests/data/goldens/tiny-k3/");
  auto toks = nlohmann::json::parse(read(g + "tokens.json")).get<std::vector<int>>();
  std::string list;
  for (size_t i = 0; i < toks.size(); ++i) {
    if (i > 0) list += ',';
    list += std::to_string(toks[i]);
  }
  for (std::string mode : {"prefill", "decode"}) {
    const std::string out = t.str() + "/" + mode + ".npy";
    auto r = sh(k3bin() + " logits -m " + k3test::source_path("tests/data/tiny-k3") + " --tokens " + list +
                (mode == "decode" ? " --decode" : "") + " --out " + out + " 2>/dev/null");
    ASSERT_EQ(r.status, 0);
    auto a = k3::read_npy_f32(out), b = k3::read_npy_f32(g + "logits_" + mode + ".npy");
    ASSERT_EQ(a.shape, b.shape);
    ASSERT_EQ(a.shape.size(), 2u);
    // The same metric and tolerance as the in-process golden tests, argmax at every position included.
    auto c = k3test::compare_logits(a.data, b.data, a.shape[0], a.shape[1]);
    EXPECT_LT(c.rel, k3test::golden_tolerance("tiny-k3")) << mode;
    EXPECT_EQ(c.argmax_mismatch, 0) << mode;
  }
}

TEST(Cli, TokenizeRoundTrip) {
  K3_SKIP_WITHOUT_SHARED();
  KimiTokenizerDir m;
  k3test::TempDir t;
  const std::string text = "Hello, world! 你好世界 1234567890 <|end_of_msg|>\n  def f(x):\treturn x**2\n";
  std::ofstream(t.str() + "/in.txt") << text;
  auto r = sh(k3bin() + " tokenize -m " + m.d.str() + " < " + t.str() + "/in.txt");
  ASSERT_EQ(r.status, 0);
  auto ids = nlohmann::json::parse(r.out).get<std::vector<int>>();
  EXPECT_EQ((std::vector<int>(ids.begin(), ids.begin() + 4)), (std::vector<int>{19180, 11, 2695, 0}));
  for (int id : ids) EXPECT_LT(id, 163584);  // encode_ordinary: no special ids
  std::ofstream(t.str() + "/ids.json") << r.out;
  auto back = sh(k3bin() + " tokenize --decode -m " + m.d.str() + " < " + t.str() + "/ids.json");
  ASSERT_EQ(back.status, 0);
  EXPECT_EQ(back.out, text);
  // --special maps the marker to its id.
  auto sp = sh(k3bin() + " tokenize --special -m " + m.d.str() + " < " + t.str() + "/in.txt");
  auto sids = nlohmann::json::parse(sp.out).get<std::vector<int>>();
  EXPECT_NE(std::find(sids.begin(), sids.end(), 163586), sids.end());
}

TEST(Cli, InfoReportsSizes) {
  auto r = sh(k3bin() + " info -m " + k3test::source_path("tests/data/tiny-k3"));
  ASSERT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("kimi_k3"), std::string::npos);
  EXPECT_NE(r.out.find("5 KDA + 3 MLA"), std::string::npos);
  EXPECT_NE(r.out.find("MXFP4"), std::string::npos);
}

TEST(Cli, BadInputGivesClearErrors) {
  K3_SKIP_WITHOUT_SHARED();
  k3test::TempDir t;
  auto r = sh(k3bin() + " info -m /nonexistent 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("k3: error:"), std::string::npos) << r.out;
  r = sh(k3bin() + " logits -m " + k3test::source_path("tests/data/tiny-k3") + " --tokens 1,99999 --out " + t.str() + "/x.npy 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("out of range"), std::string::npos) << r.out;
  KimiTokenizerDir m;
  std::ofstream(t.str() + "/bad.json") << "[1, 2, \"x\"";
  r = sh(k3bin() + " tokenize --decode -m " + m.d.str() + " < " + t.str() + "/bad.json 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("JSON array"), std::string::npos) << r.out;
  r = sh(k3bin() + " frobnicate 2>&1");
  EXPECT_NE(r.status, 0);
}

// Issue 11 item 9: ids that nlohmann would wrap (4294967361 -> 65), truncate (1.5 -> 1) or pass
// through (negative, past the vocabulary) are rejected with the element named.
TEST(Cli, TokenizeDecodeRejectsIdsThatAreNotTokenIds) {
  k3test::TempDir t;
  const std::string model = k3test::source_path("tests/data/tiny-tokenizer");
  for (const std::string ids : {"[4294967361]", "[1.5]", "[-1]", "[1e30]", "[1024]", "[1, true]", "{\"a\": 1}"}) {
    std::ofstream(t.str() + "/ids.json") << ids;
    auto r = sh(k3bin() + " tokenize --decode -m " + model + " < " + t.str() + "/ids.json 2>&1");
    EXPECT_EQ(r.status, 1) << ids << ": " << r.out;
    EXPECT_NE(r.out.find("k3: error: --decode"), std::string::npos) << ids << ": " << r.out;
  }
  std::ofstream(t.str() + "/ids.json") << "[72, 1023]";
  EXPECT_EQ(sh(k3bin() + " tokenize --decode -m " + model + " < " + t.str() + "/ids.json").status, 0);
}

// `k3 run` is a one-request client of the serving engine: seeded runs repeat, greedy runs are
// deterministic and stop at -n, -n 0 prints only the prompt, bad sampling options are clear errors.
TEST(Cli, RunIsRepeatableAndValidates) {
  const std::string run = k3bin() + " run -p 'It is a truth universally'";
  auto a = sh(run + " -n 24 --seed 5 2>/dev/null"), b = sh(run + " -n 24 --seed 5 2>/dev/null");
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(a.out, b.out);
  EXPECT_GT(a.out.size(), std::string("It is a truth universally\n").size());
  auto g1 = sh(run + " -n 16 --temp 0 2>/dev/null"), g2 = sh(run + " -n 16 --temp 0 --seed 9 2>/dev/null");
  EXPECT_EQ(g1.out, g2.out);  // greedy ignores the seed
  auto v = sh(run + " -n 16 --temp 0 -v 2>&1 >/dev/null");
  EXPECT_NE(v.out.find("generated 16 tokens"), std::string::npos) << v.out;
  auto z = sh(run + " -n 0 2>/dev/null");
  EXPECT_EQ(z.status, 0);
  EXPECT_EQ(z.out, "It is a truth universally\n");
  auto bad = sh(run + " --top-p 2 2>&1");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.out.find("top_p"), std::string::npos) << bad.out;
}

// The prompt from stdin (-p -) or a file (-f) runs exactly as the same text given with -p; giving it twice,
// not at all, a device as the file or more than the 64 MiB bound on stdin is a one-line error.
TEST(Cli, RunPromptFromStdinOrFile) {
  k3test::TempDir t;
  const std::string file = t.str() + "/p.txt";
  std::ofstream(file) << "It is a truth universally";
  const auto ref = sh(k3bin() + " run -p 'It is a truth universally' -n 12 --temp 0 2>/dev/null");
  ASSERT_EQ(ref.status, 0);
  const auto from_stdin = sh("printf 'It is a truth universally' | " + k3bin() + " run -p - -n 12 --temp 0 2>/dev/null");
  const auto from_file = sh(k3bin() + " run -f " + file + " -n 12 --temp 0 2>/dev/null");
  EXPECT_EQ(from_stdin.status, 0);
  EXPECT_EQ(from_stdin.out, ref.out);
  EXPECT_EQ(from_file.out, ref.out);
  auto r = sh(k3bin() + " run -p x -f " + file + " 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "k3: error: give the prompt once: -p TEXT, -p - (stdin) or -f FILE\n");
  r = sh(k3bin() + " run -n 1 2>&1");
  EXPECT_EQ(r.out, "k3: error: a prompt is required: -p TEXT, -p - (stdin) or -f FILE\n");
  r = sh("timeout 20 " + k3bin() + " run -f /dev/zero 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("is not a regular file"), std::string::npos) << r.out;
  r = sh("head -c 70000000 /dev/zero | timeout 20 " + k3bin() + " run -p - 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("larger than 64 MiB"), std::string::npos) << r.out;
}

// `k3 info` on a bare config (a *.json file, or a directory with config.json and no weights) prints the sizes
// without weights: K3's preset shows its 2.78T / 104B and 434 MB of KDA state; a bad config is one line.
TEST(Cli, InfoOnABareConfig) {
  auto r = sh(k3bin() + " info -m " + k3test::source_path("resources/presets/kimi-k3.json") + " 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(config only: no weights read)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers           93 (69 KDA + 24 MLA)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("params total     2.78T"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("434.11 MB float32"), std::string::npos) << r.out;
  k3test::TempDir t;
  std::filesystem::copy_file(k3test::source_path("models/k3-tiny/config.json"), t.str() + "/config.json");
  r = sh(k3bin() + " info -m " + t.str() + " 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("layers           12 (9 KDA + 3 MLA)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("weight bytes"), std::string::npos) << r.out;
  std::ofstream(t.str() + "/bad.json") << "{\"x\": 1}";
  r = sh(k3bin() + " info -m " + t.str() + "/bad.json 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("model_type: required field is missing"), std::string::npos) << r.out;
}

// Command-line mistakes exit 2 with one "k3: usage error:" line and the nearest verb or flag (exit codes:
// README); unknown words get no guess.
TEST(Cli, UsageErrorsExit2WithDidYouMean) {
  auto r = sh(k3bin() + " run -p x --tmep 0.5 2>&1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out.rfind("k3: usage error: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("did you mean '--temp' for '--tmep'?"), std::string::npos) << r.out;
  r = sh(k3bin() + " rn -p x 2>&1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("did you mean 'run'?"), std::string::npos) << r.out;
  r = sh(k3bin() + " bench serve --num-promts 3 2>&1");
  EXPECT_NE(r.out.find("did you mean '--num-prompts'"), std::string::npos) << r.out;
  r = sh(k3bin() + " xyzzy 2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out.find("did you mean"), std::string::npos) << r.out;
  r = sh(k3bin() + " run -p x --top-k abc 2>&1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(sh(k3bin() + " --help >/dev/null 2>&1").status, 0);
  EXPECT_EQ(sh(k3bin() + " run --help >/dev/null 2>&1").status, 0);
}

// A value in brackets is one value: CLI11's list syntax used to turn --stop "[a]" into the stop string "a"
// (and --api-key "[k1,k2]" into two keys, -ot / --tensor-type rules into pieces).
TEST(Cli, BracketedValuesAreNotSplit) {
  const std::string run = k3bin() + " run -p 'It is' -n 12 --temp 0 2>/dev/null";
  const auto plain = sh(run), bracketed = sh(run + " --stop '[a]'"), split = sh(run + " --stop a");
  ASSERT_EQ(plain.status, 0);
  EXPECT_EQ(bracketed.out, plain.out);  // "[a]" never occurs in the text
  EXPECT_LT(split.out.size(), plain.out.size()) << split.out;  // while "a" does (the check can fail)
}

// Device selection errors are clear in any build (a CPU-only build names the missing backend; a CUDA
// build on a machine without a GPU says so) and never crash.
TEST(Cli, DeviceOptionErrors) {
  const std::string m = " -m " + k3test::source_path("tests/data/tiny-k3");
  auto r = sh(k3bin() + " logits" + m + " --tokens 1,2 --out /dev/null --device tpu 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("expected cpu, cuda or cuda:N"), std::string::npos) << r.out;
  r = sh(k3bin() + " logits" + m + " --tokens 1,2 --out /dev/null --device cuda:x 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("cuda:N"), std::string::npos) << r.out;
  r = sh(k3bin() + " logits" + m + " --tokens 1,2 --out /dev/null --load-format dummy 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;  // random weights from the config, on the CPU too (model/dummy_checkpoint.h)
  r = sh(k3bin() + " logits" + m + " --tokens 1,2 --out /dev/null --num-layers 2 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("dummy only"), std::string::npos) << r.out;
  r = sh(k3bin() + " logits" + m + " --tokens 1,2 --out /dev/null --device cuda 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(r.out.find("built without the CUDA backend") != std::string::npos ||
              r.out.find("no CUDA device") != std::string::npos)
      << r.out;
}

// --moe-activation-dtype on every verb that runs a model: mxfp8 and q8 change the CPU's logits, an unknown value is a
// usage error naming the flag (the CUDA backend's form: tests/cuda, CudaModelMxfp8.*).
TEST(Cli, MoeActivationDtypeFlag) {
  k3test::TempDir t;
  const std::string logits = k3bin() + " logits -m " + k3test::source_path("tests/data/tiny-k3") + " --tokens 1,2,3,4,5";
  ASSERT_EQ(sh(logits + " --out " + (t.path / "f.npy").string() + " 2>&1").status, 0);
  auto r = sh(logits + " --moe-activation-dtype mxfp8 --out " + (t.path / "m.npy").string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto f = k3::read_npy_f32((t.path / "f.npy").string()), m = k3::read_npy_f32((t.path / "m.npy").string());
  EXPECT_EQ(f.shape, m.shape);
  EXPECT_NE(f.data, m.data) << "mxfp8 changed nothing";
  r = sh(logits + " --moe-activation-dtype q8 --out " + (t.path / "q.npy").string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto q = k3::read_npy_f32((t.path / "q.npy").string());
  EXPECT_EQ(f.shape, q.shape);
  EXPECT_NE(f.data, q.data) << "q8 changed nothing";
  EXPECT_NE(m.data, q.data) << "q8 is mxfp8";
  for (const char* verb : {"logits --tokens 1", "run -p x -n 1", "perplexity --file /dev/null", "bench offline -p 8 -n 0 -r 1",
                           "serve", "chat"}) {
    r = sh(k3bin() + " " + verb + " -m " + k3test::source_path("tests/data/tiny-k3") + " --moe-activation-dtype fp8 2>&1");
    EXPECT_EQ(r.status, 2) << verb;
    EXPECT_NE(r.out.find("--moe-activation-dtype: fp8 not in {float32,mxfp8,q8}"), std::string::npos) << verb << ": " << r.out;
  }
}

// Issue 14: `k3 info` prints the CPU, its features, the kernel tier and why, and the compute threads;
// -t sets them (and wins over $K3_NUM_THREADS, which applies without -t).
TEST(Cli, InfoReportsCpuKernelTierAndThreads) {
  const std::string info = k3bin() + " info -m " + k3test::source_path("tests/data/tiny-k3");
  auto r = sh(info + " -t 3 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\ncpu features     avx avx2 fma f16c"), std::string::npos) << r.out;
  EXPECT_TRUE(r.out.find("\ncpu kernels      avx2: ") != std::string::npos ||
              r.out.find("\ncpu kernels      avx512: ") != std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\nthreads          3 compute threads (-t), threads not pinned"), std::string::npos) << r.out;
  r = sh("K3_NUM_THREADS=1 " + info + " 2>&1");
  EXPECT_NE(r.out.find("\nthreads          1 compute threads (K3_NUM_THREADS)"), std::string::npos) << r.out;
  r = sh("K3_NUM_THREADS=1 " + info + " --threads 2 2>&1");
  EXPECT_NE(r.out.find("\nthreads          2 compute threads (-t)"), std::string::npos) << r.out;
}

// $K3_CPU_ISA forces a tier: a tier with kernels runs, anything else is a one-line error at start-up
// whatever the verb (tokenize runs no kernel at all).
TEST(Cli, CpuIsaOverride) {
  const std::string info = k3bin() + " info -m " + k3test::source_path("tests/data/tiny-k3") + " 2>&1";
  auto r = sh("K3_CPU_ISA=avx2 " + info);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("cpu kernels      avx2: forced by K3_CPU_ISA"), std::string::npos) << r.out;
  r = sh("K3_CPU_ISA=garbage " + k3bin() + " tokenize -m " + k3test::source_path("tests/data/tiny-tokenizer") +
         " </dev/null 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "k3: error: K3_CPU_ISA=garbage: unknown kernel tier (expected exact, avx2, avx2int8, avx512, avx512bf16 or amx)\n");
  // "exact": the best exact tier; unset (the test binaries set exact, tests/common/test_main.cpp): the fastest.
  r = sh("K3_CPU_ISA=exact " + info);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(": forced by K3_CPU_ISA=exact (fp32 products of weights and activations)"), std::string::npos) << r.out;
  r = sh("env -u K3_CPU_ISA " + info);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(r.out.find(": the best tier this CPU offers") != std::string::npos ||
              r.out.find(": the CPU offers ") != std::string::npos)
      << r.out;
  // Every tier has kernels: each runs where the CPU has it, else the error names what is missing.
  for (const std::string tier : {"avx2int8", "avx512", "avx512bf16", "amx"}) {
    r = sh("K3_CPU_ISA=" + tier + " " + info);
    if (r.status == 0)
      EXPECT_NE(r.out.find("cpu kernels      " + tier + ": forced by K3_CPU_ISA"), std::string::npos) << r.out;
    else
      EXPECT_EQ(r.out.rfind("k3: error: K3_CPU_ISA=" + tier + ": this CPU cannot run it (missing: ", 0), 0u) << r.out;
  }
}

// -t/--threads and --numa on every verb that runs a model: range-checked, a clear error; on a one-node
// machine --numa is a no-op that says so; the thread count does not change the logits (bit for bit).
TEST(Cli, ThreadsAndNumaFlags) {
  k3test::TempDir t;
  const std::string logits = k3bin() + " logits -m " + k3test::source_path("tests/data/tiny-k3") + " --tokens 1,2,3,4,5";
  for (const char* bad : {"-t 0", "--threads 1025", "-t -2"}) {
    auto r = sh(logits + " --out /dev/null " + bad + " 2>&1");
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_NE(r.out.find("k3: error: --threads/-t: expected 1..1024"), std::string::npos) << bad << ": " << r.out;
  }
  auto r = sh(logits + " --out /dev/null --numa interleave 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("k3: error: --numa: expected distribute, isolate or numactl, got 'interleave'"), std::string::npos)
      << r.out;
  for (const char* verb : {"run -p x -n 1", "perplexity --file /dev/null", "bench offline -p 8 -n 0 -r 1", "serve"}) {
    r = sh(k3bin() + " " + verb + " -m " + k3test::source_path("tests/data/tiny-k3") + " -t 0 2>&1");
    EXPECT_EQ(r.status, 1) << verb;
    EXPECT_NE(r.out.find("--threads/-t: expected 1..1024"), std::string::npos) << verb << ": " << r.out;
  }
  const bool one_node = k3test::fs::exists("/sys/devices/system/node/node0") && !k3test::fs::exists("/sys/devices/system/node/node1");
  for (const char* mode : {"distribute", "isolate"}) {
    r = sh(logits + " --out " + t.str() + "/" + mode + ".npy -t 2 --numa " + mode + " 2>&1");
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(std::string("k3: --numa ") + mode + ": "), std::string::npos) << r.out;
    if (one_node) {
      EXPECT_NE(r.out.find("one NUMA node (CPUs "), std::string::npos) << r.out;
    }
  }
  ASSERT_EQ(sh(logits + " --out " + t.str() + "/t1.npy -t 1 2>/dev/null").status, 0);
  EXPECT_EQ(read(t.str() + "/t1.npy"), read(t.str() + "/distribute.npy"));
}

// `k3 bench offline` records the compute threads it ran with.
TEST(Cli, BenchOfflineRecordsThreads) {
  k3test::TempDir t;
  auto r = sh(k3bin() + " bench offline -m " + k3test::source_path("tests/data/tiny-k3") + " -p 8 -n 2 -r 1 -t 1 -o " +
              t.str() + "/b.json 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(", 1 threads ..."), std::string::npos) << r.out;
  // The memory rate it measured itself: read before the tests and again after the one tg test (its roofline takes
  // the mean of the two).
  size_t reads = 0;
  for (size_t p = r.out.find("memory read bandwidth"); p != std::string::npos; p = r.out.find("memory read bandwidth", p + 1)) ++reads;
  EXPECT_EQ(reads, 2u) << r.out;
  auto j = nlohmann::json::parse(read(t.str() + "/b.json"));
  EXPECT_EQ(j["threads"], 1);
  EXPECT_NE(j["placement"].get<std::string>().find("1 compute threads (-t)"), std::string::npos);
}

// `k3 bench offline --ubatch-size N` (llama-bench's -ub): a pp test prefills each prompt in forwards of at most N
// tokens and says so in the JSON; a negative N is a usage error (status 2) before any model loads.
TEST(Cli, BenchOfflineUbatchSize) {
  k3test::TempDir t;
  const std::string m = " bench offline -m " + k3test::source_path("tests/data/tiny-k3");
  auto r = sh(k3bin() + m + " -p 20 -n 0 --ubatch-size 8 -r 1 -t 1 -o " + t.str() + "/u.json 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(read(t.str() + "/u.json"));
  ASSERT_EQ(j["results"].size(), 1u) << j.dump();
  EXPECT_EQ(j["results"][0]["n_prompt"], 20);
  EXPECT_EQ(j["results"][0]["n_ubatch"], 8);
  EXPECT_GT(j["results"][0]["avg_ts"].get<double>(), 0.0);
  // The forwards themselves: the CPU profile counts one embed per forward -- 3 chunks (8 + 8 + 4) for the warm-up
  // and the timed run, against 1 + 1 without the option.
  auto embeds = [&](const std::string& opt) {
    auto p = sh("K3_CPU_PROFILE=1 " + k3bin() + m + " -p 20 -n 0 -r 1 -t 1" + opt + " 2>&1");
    EXPECT_EQ(p.status, 0) << p.out;
    std::smatch g;
    return std::regex_search(p.out, g, std::regex(R"(\n  embed +[0-9.]+ +[0-9.]+% +([0-9]+) )")) ? std::stoi(g[1]) : -1;
  };
  EXPECT_EQ(embeds(" --ubatch-size 8"), 6);
  EXPECT_EQ(embeds(""), 2);
  auto bad = sh(k3bin() + m + " -p 20 -n 0 --ubatch-size -3 -r 1 2>&1");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("ubatch"), std::string::npos) << bad.out;
}

// The CPU's copies of the MXFP4 routed experts (mxfp4_rowblocks.h): made by the int8 tiers' loaders (avx512bf16 and
// avx2int8, each where the CPU has it) and said so on stderr, with the stored experts' pages they release, not with
// --no-repack (llama.cpp's flag), nor on the exact tier; all run.
TEST(Cli, ExpertCopiesAndNoRepack) {
  if (!k3::cpu::mxfp4_rowblocks_cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  const std::string run = " run -p 'It is a truth universally' -n 12 --temp 0 2>&1";
  const Result exact = sh("K3_CPU_ISA=exact " + k3bin() + run);
  ASSERT_EQ(exact.status, 0) << exact.out;
  EXPECT_EQ(exact.out.find("repacked"), std::string::npos) << exact.out;
  std::vector<std::string> tiers = {"avx2int8"};
  if (k3::cpu::mxfp4_rowblocks_form_ok(k3::cpu::Mxfp4RowBlocksForm::Avx512Bf16)) tiers.push_back("avx512bf16");
  for (const std::string& tier : tiers) {
    const Result copies = sh("K3_CPU_ISA=" + tier + " " + k3bin() + run),
                 none = sh("K3_CPU_ISA=" + tier + " " + k3bin() + run + " --no-repack");
    ASSERT_EQ(copies.status, 0) << tier << ": " << copies.out;
    ASSERT_EQ(none.status, 0) << tier << ": " << none.out;
    EXPECT_NE(copies.out.find("MXFP4 routed experts repacked"), std::string::npos) << tier << ": " << copies.out;
    EXPECT_NE(copies.out.find("the stored experts' "), std::string::npos) << tier << ": " << copies.out;  // released
    EXPECT_NE(copies.out.find(" of pages released"), std::string::npos) << tier << ": " << copies.out;
    EXPECT_EQ(none.out.find("repacked"), std::string::npos) << tier << ": " << none.out;
  }
}

// `k3 convert` writes a GGUF that `k3 logits` / `k3 run` read as they read the HF dir: the same logits file,
// byte for byte; the same greedy text with the tokenizer taken from the GGUF's own metadata; and a clear
// error where the GGUF has no tokenizer.
TEST(Cli, ConvertToGgufAndRunIt) {
  k3test::TempDir t;
  const std::string hf = k3test::source_path("models/k3-tiny"), gguf = (t.path / "k3-tiny.gguf").string();
  ASSERT_EQ(sh(k3bin() + " convert -m " + hf + " -o " + gguf + " 2>/dev/null").status, 0);
  const std::string toks = "1,2,3,300,400,500,17";
  ASSERT_EQ(sh(k3bin() + " logits -m " + hf + " --tokens " + toks + " --out " + (t.path / "h.npy").string() + " 2>/dev/null").status, 0);
  ASSERT_EQ(sh(k3bin() + " logits -m " + gguf + " --tokens " + toks + " --out " + (t.path / "g.npy").string() + " 2>/dev/null").status, 0);
  EXPECT_EQ(read((t.path / "h.npy").string()), read((t.path / "g.npy").string()));
  // --no-mmap (the files read into memory, not mapped): the same bits from both formats.
  for (const std::string& m : {hf, gguf}) {
    const std::string out = (t.path / "nm.npy").string();
    ASSERT_EQ(sh(k3bin() + " logits --no-mmap -m " + m + " --tokens " + toks + " --out " + out + " 2>/dev/null").status, 0) << m;
    EXPECT_EQ(read(out), read((t.path / "h.npy").string())) << m;
  }
  const std::string run = " -p 'It is a truth universally' -n 12 --temp 0 2>/dev/null";
  const Result a = sh(k3bin() + " run -m " + hf + run), b = sh(k3bin() + " run -m " + gguf + run);
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(b.status, 0);
  EXPECT_EQ(a.out, b.out);
  EXPECT_FALSE(a.out.empty());
  // bench offline: the HF dir's decode roofline columns come from the config's formats, a GGUF's (on the CPU)
  // from its weights as loaded -- here the same matrices in the same formats, so the same GB a step (the config
  // also counts the vectors: < 3% on k3-tiny; DecodeRoofline.LoadedWeightBytesAreTheBoundFormats checks the count).
  const std::string tg = " bench offline -p 0 -n 2 -r 1 --mem-bw 20 2>&1";
  const Result bh = sh(k3bin() + tg + " -m " + hf), bg = sh(k3bin() + tg + " -m " + gguf);
  EXPECT_EQ(bh.status, 0);
  EXPECT_EQ(bg.status, 0);
  EXPECT_NE(bh.out.find("| GB/step |"), std::string::npos) << bh.out;
  EXPECT_NE(bg.out.find("| GB/step |"), std::string::npos) << bg.out;
  EXPECT_NE(bg.out.find("decode roofline from the GGUF's weights as loaded"), std::string::npos) << bg.out;
  auto gb_step = [](const std::string& out) {  // the tg2 row's GB/step column
    const size_t row = out.find("| tg2 |");
    if (row == std::string::npos) return -1.0;
    size_t c = row;
    for (int bar = 0; bar < 4; ++bar) c = out.find('|', c + 1);
    return std::stod(out.substr(c + 1));
  };
  EXPECT_GT(gb_step(bh.out), 0);
  EXPECT_NEAR(gb_step(bg.out), gb_step(bh.out), 0.0011) << bh.out << bg.out;  // printed to 0.001 GB
  const std::string bare = (t.path / "bare.gguf").string();
  ASSERT_EQ(sh(k3bin() + " convert --no-vocab -m " + hf + " -o " + bare + " 2>/dev/null").status, 0);
  const Result c = sh(k3bin() + " run -m " + bare + " -p hi -n 2 2>&1");
  EXPECT_EQ(c.status, 1);
  EXPECT_NE(c.out.find("k3: error: '" + bare + "' has no tokenizer"), std::string::npos) << c.out;
}

// `k3 quantize --load-format dummy`: random weights at the config's shapes, cut by --num-layers (a benchmark GGUF of a
// model too big to have here). The file loads with the cut layer count, runs, is the same bytes twice (seeded) and
// not the checkpoint's own weights; --num-layers without dummy, and dummy without a config directory, are errors.
TEST(Cli, QuantizeDummyWeights) {
  k3test::TempDir t;
  const std::string hf = k3test::source_path("models/k3-tiny");
  const std::string a = (t.path / "a.gguf").string(), b = (t.path / "b.gguf").string(), real = (t.path / "r.gguf").string();
  const std::string q = k3bin() + " quantize --load-format dummy --num-layers 2 " + hf + " ";
  ASSERT_EQ(sh(q + a + " Q4_K_M 2>/dev/null").status, 0);
  ASSERT_EQ(sh(q + b + " Q4_K_M 2>/dev/null").status, 0);
  ASSERT_EQ(sh(k3bin() + " quantize " + hf + " " + real + " Q4_K_M 2>/dev/null").status, 0);
  EXPECT_EQ(read(a), read(b));
  const Result info = sh(k3bin() + " info -m " + a + " 2>&1");
  EXPECT_EQ(info.status, 0) << info.out;
  EXPECT_TRUE(std::regex_search(info.out, std::regex("layers +2 \\("))) << info.out;
  const Result full = sh(k3bin() + " info -m " + real + " 2>&1");
  EXPECT_FALSE(std::regex_search(full.out, std::regex("layers +2 \\("))) << full.out;
  const std::string toks = " --tokens 1,2,3,300 --out ";
  ASSERT_EQ(sh(k3bin() + " logits -m " + a + toks + (t.path / "a.npy").string() + " 2>/dev/null").status, 0);
  const Result r = sh(k3bin() + " run -m " + a + " -p hi -n 3 --temp 0 2>/dev/null");
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.out.empty());
  const Result no_dummy = sh(k3bin() + " quantize --num-layers 2 " + hf + " " + (t.path / "x.gguf").string() + " Q4_K_M 2>&1");
  EXPECT_EQ(no_dummy.status, 1);
  EXPECT_NE(no_dummy.out.find("--num-layers applies to --load-format dummy only"), std::string::npos) << no_dummy.out;
  const Result not_dir = sh(k3bin() + " quantize --load-format dummy " + a + " " + (t.path / "y.gguf").string() + " Q4_K_M 2>&1");
  EXPECT_EQ(not_dir.status, 1);
  EXPECT_NE(not_dir.out.find("must be a directory with a config.json"), std::string::npos) << not_dir.out;
}

// The codebook i-quants through the CLI: a low-bit expert preset plus an i-quant rule writes a GGUF that runs,
// the size table lists the type, and without --imatrix a warning names the types that want one. --tensor-type
// repeats like llama-quantize's (it was refused as "At Most 1" until session 19).
TEST(Cli, QuantizeWithCodebookIQuants) {
  k3test::TempDir t;
  const std::string hf = k3test::source_path("models/k3-tiny"), out = (t.path / "eiq1.gguf").string();
  const Result q = sh(k3bin() + " quantize --tensor-type 'attn_q_a=iq1_m' --tensor-type 'attn_kv_a=iq3_s' " + hf + " " + out +
                      " Q4_K_M-EIQ1 2>&1");
  ASSERT_EQ(q.status, 0) << q.out;
  EXPECT_NE(q.out.find("warning: IQ1_M, IQ2_XXS, IQ1_S without --imatrix"), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("| iq1_m |"), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("| iq3_s |"), std::string::npos) << q.out;
  const Result r = sh(k3bin() + " run -m " + out + " -p hi -n 2 --temp 0 2>/dev/null");
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.out.empty());
}

// Issue 17: --speculative-config on run / serve / bench offline. A bad value is one `k3: error:` line and
// exit status 1 before any model loads; `k3 run` prints the same greedy text with it; bench offline
// reports speed on/off and the acceptance.
// The block drafter through the verbs: the golden drafter (random weights) on k3-tiny, output == off; a drafter
// directory that does not exist and a k above its block_size are one-line start-up errors.
TEST(Cli, BlockDrafterFlag) {
  const std::string run = k3bin() + " run -p 'def add(a, b):\n    return a + b\n\ndef' -n 24 --temp 0";
  const std::string spec =
      " --speculative-config '{\"method\": \"dspark\", \"model\": \"tests/data/drafter-golden/drafter\", \"num_speculative_tokens\": 4}'";
  k3test::TempDir t;
  auto off = sh(run + " 2>/dev/null"), on = sh(run + spec + " -v 2>" + t.str() + "/err.txt");
  ASSERT_EQ(on.status, 0) << read(t.str() + "/err.txt");
  EXPECT_EQ(on.out, off.out);
  const std::string err = read(t.str() + "/err.txt");
  EXPECT_NE(err.find("block_drafter k=4 drafter tests/data/drafter-golden/drafter"), std::string::npos) << err;
  EXPECT_NE(err.find("mean acceptance length"), std::string::npos) << err;
  for (const std::string bad : {"'{\"method\": \"block_drafter\", \"model\": \"/nonexistent\", \"num_speculative_tokens\": 2}'",
                                "'{\"method\": \"block_drafter\", \"model\": \"tests/data/drafter-golden/drafter\", \"num_speculative_tokens\": 9}'"}) {
    auto r = sh(run + " --speculative-config " + bad + " 2>&1 >/dev/null");
    EXPECT_EQ(r.status, 1) << bad << ": " << r.out;
    EXPECT_EQ(r.out.rfind("k3: error: ", 0), 0u) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
}

TEST(Cli, SpeculativeConfigFlag) {
  const std::string run = k3bin() + " run -p 'It is a truth universally acknowledged, that a single man. It is a truth' -n 40 --temp 0";
  const std::string spec = " --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 3, \"prompt_lookup_min\": 1}'";
  k3test::TempDir t;
  auto off = sh(run + " 2>/dev/null"), on = sh(run + spec + " -v 2>" + t.str() + "/err.txt");
  ASSERT_EQ(on.status, 0);
  EXPECT_EQ(on.out, off.out);
  EXPECT_NE(read(t.str() + "/err.txt").find("mean acceptance length"), std::string::npos) << read(t.str() + "/err.txt");
  for (const std::string verb : {"run -p x", "serve --port 0", "bench offline"}) {
    for (const std::string bad : {"'{'", "'{\"method\": \"eagle\", \"num_speculative_tokens\": 2}'",
                                  "'{\"method\": \"ngram\", \"num_speculative_tokens\": 99}'"}) {
      auto r = sh(k3bin() + " " + verb + " --speculative-config " + bad + " 2>&1");
      EXPECT_EQ(r.status, 1) << verb << " " << bad << ": " << r.out;
      EXPECT_EQ(r.out.rfind("k3: error: --speculative-config: ", 0), 0u) << r.out;
      EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    }
  }
  auto b = sh(k3bin() + " bench offline -n 24 -b 1 -r 1" + spec + " -o " + t.str() + "/s.json 2>&1");
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("| code | 1 |"), std::string::npos) << b.out;
  auto j = nlohmann::json::parse(read(t.str() + "/s.json"));
  ASSERT_EQ(j["results"].size(), 3u);  // code, summary, chat (k3-tiny's chat format)
  EXPECT_EQ(j["results"][2]["task"], "chat");
  EXPECT_GT(j["results"][2]["prompt_tokens"].get<int64_t>(), 20);
  EXPECT_GT(j["results"][0]["num_drafts"].get<int64_t>(), 0);
}
