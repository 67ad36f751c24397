// Same-weights check tool for the llama.cpp peer (built against the peer's libllama, outside the repo).
//  peerdump M.gguf info x             -> llama_print_system_info() (the CPU features ggml was built for)
//  peerdump M.gguf tok TEXT            -> token ids of TEXT (no BOS), comma-separated
//  peerdump M.gguf logits IDS OUT.bin  -> float32 [n, V] logits of one prefill of IDS (comma-separated)
//  peerdump M.gguf gen IDS N           -> N greedy ids after IDS (prefill, then one token per decode), and text
// fp32 KV cache, no flash attention, 2 threads (as python/oracles/llama_cpp_kimi.py).
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
static void die(const char* m) { std::fprintf(stderr, "peerdump: %s\n", m); std::exit(1); }
static std::vector<llama_token> parse_ids(const char* s) {
  std::vector<llama_token> v; std::string cur;
  for (const char* p = s;; ++p) { if (*p == ',' || *p == 0) { if (!cur.empty()) v.push_back(std::atoi(cur.c_str())); cur.clear(); if (!*p) break; } else if (*p != ' ' && *p != '[' && *p != ']') cur += *p; }
  return v;
}
int main(int argc, char** argv) {
  if (argc < 4) die("usage");
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  auto mp = llama_model_default_params(); mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp); if (!model) die("load");
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int V = llama_vocab_n_tokens(vocab);
  const std::string mode = argv[2];
  if (mode == "info") { std::printf("%s\n", llama_print_system_info()); return 0; }
  if (mode == "tok") {
    std::vector<llama_token> t(strlen(argv[3]) + 16);
    int n = llama_tokenize(vocab, argv[3], strlen(argv[3]), t.data(), t.size(), false, false); if (n < 0) die("tokenize");
    for (int i = 0; i < n; ++i) std::printf("%s%d", i ? "," : "", t[i]);
    std::printf("\n"); return 0;
  }
  auto toks = parse_ids(argv[3]);
  const int n = toks.size();
  auto cp = llama_context_default_params(); cp.n_ctx = 1024; cp.n_batch = 1024; cp.n_ubatch = 1024; cp.n_threads = 2; cp.n_threads_batch = 2;
  cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp); if (!ctx) die("ctx");
  llama_batch b = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) { b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = mode == "logits" || i == n - 1; }
  b.n_tokens = n;
  if (llama_decode(ctx, b) != 0) die("decode");
  if (mode == "logits") {
    FILE* o = std::fopen(argv[4], "wb"); if (!o) die("out");
    for (int i = 0; i < n; ++i) std::fwrite(llama_get_logits_ith(ctx, i), 4, V, o);
    std::fclose(o); std::printf("%d %d\n", n, V); return 0;
  }
  const int N = std::atoi(argv[4]);
  std::string text; int pos = n; const float* l = llama_get_logits_ith(ctx, n - 1);
  for (int s = 0; s < N; ++s) {
    int best = 0; for (int v = 1; v < V; ++v) if (l[v] > l[best]) best = v;
    std::printf("%s%d", s ? "," : "", best);
    char buf[256]; int k = llama_token_to_piece(vocab, best, buf, sizeof buf, 0, true); if (k > 0) text.append(buf, k);
    llama_batch one = llama_batch_init(1, 0, 1); one.token[0] = best; one.pos[0] = pos++; one.n_seq_id[0] = 1; one.seq_id[0][0] = 0; one.logits[0] = 1; one.n_tokens = 1;
    if (llama_decode(ctx, one) != 0) die("decode"); llama_batch_free(one);
    l = llama_get_logits_ith(ctx, 0);
  }
  std::printf("\n%s\n", text.c_str());
  return 0;
}
