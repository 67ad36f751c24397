// Seeded random mutations of the real tiny checkpoint (tests/data/tiny-k3) and the tiny tokenizer,
// end to end through the loaders (Checkpoint + load_model_config + bind_weights, Tokenizer::load):
// every case must end in k3::Error with a message, never a crash, hang or huge allocation
// (issue 11, "checkpoint mutation test"). Unmodified files are symlinked into each case's directory.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <fstream>
#include <random>
#include <set>

#include "k3/core/error.h"
#include "k3/model/config.h"
#include "k3/model/weights.h"
#include "k3/text/tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kCkpt = k3test::source_path("tests/data/tiny-k3");
const std::string kTok = k3test::source_path("tests/data/tiny-tokenizer");

// A case directory: every file of `src` linked in, then one replaced by the mutation.
struct CaseDir {
  k3test::TempDir dir;
  explicit CaseDir(const std::string& src) {
    for (const auto& e : fs::directory_iterator(src)) fs::create_symlink(e.path(), dir.path / e.path().filename());
  }
  std::string path(const std::string& f) const { return (dir.path / f).string(); }
  void write(const std::string& f, const std::string& bytes) const {
    fs::remove(dir.path / f);
    std::ofstream(path(f), std::ios::binary) << bytes;
  }
};

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void load_checkpoint(const std::string& dir) {
  const k3::ModelConfig cfg = k3::load_model_config(dir);
  const k3::Checkpoint ck(dir);
  (void)k3::bind_weights(cfg, ck);
}

// Runs `load` and returns the k3::Error message (empty if it loaded).
template <typename F>
std::string error_of(F&& load) {
  try {
    load();
  } catch (const k3::Error& e) {
    return e.what()[0] ? e.what() : "(empty message)";
  }
  return "";
}

// A header value that must be rejected wherever it replaces a dimension or an offset.
json bad_number(std::mt19937_64& rng) {
  switch (rng() % 7) {
    case 0: return json(-1);
    case 1: return json(1.5);
    case 2: return json("8");
    case 3: return json(uint64_t{1} << 32);
    case 4: return json(UINT64_MAX);
    case 5: return json(nullptr);
    default: return json(int64_t{1} << 62);
  }
}

const std::vector<std::string> kShards = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                          "model-00003-of-00003.safetensors"};

// One mutation of a shard's header (or the shard's bytes); returns a label for failure messages.
std::string mutate_shard(const CaseDir& c, std::mt19937_64& rng) {
  const std::string shard = kShards[rng() % kShards.size()];
  auto [h, data] = k3test::read_safetensors_raw(kCkpt + "/" + shard);
  std::vector<std::string> names;
  for (auto& [k, v] : h.items())
    if (k != "__metadata__") names.push_back(k);
  const std::string name = names[rng() % names.size()], other = names[rng() % names.size()];
  json& t = h[name];
  const int kind = static_cast<int>(rng() % 10);
  std::string label = shard + " " + name + " kind " + std::to_string(kind);
  switch (kind) {
    case 0: t["shape"][0] = t["shape"][0].get<int64_t>() + 1 + static_cast<int64_t>(rng() % 1000); break;
    case 1: t["shape"] = json::array({uint64_t{1} << 32, uint64_t{1} << 32}); break;
    case 2: t["shape"][rng() % t["shape"].size()] = bad_number(rng); break;
    case 3: t["dtype"] = std::vector<std::string>{"F64", "I8", "BOOL", "FP8", "", "f32"}[rng() % 6]; break;
    case 4: t["data_offsets"][rng() % 2] = bad_number(rng); break;
    case 5: {  // out-of-file range of the right length
      const uint64_t n = t["data_offsets"][1].get<uint64_t>() - t["data_offsets"][0].get<uint64_t>();
      t["data_offsets"] = json::array({data.size() + rng() % 100, data.size() + rng() % 100 + n + 1});
      break;
    }
    case 6:  // another tensor's range, or a shifted one: overlap or wrong length
      if (other == name || h[other]["data_offsets"] == t["data_offsets"]) {
        t["data_offsets"][1] = t["data_offsets"][1].get<uint64_t>() + 2;
      } else {
        t["data_offsets"] = h[other]["data_offsets"];
        t["shape"] = h[other]["shape"];
        t["dtype"] = h[other]["dtype"];
      }
      break;
    case 7: h.erase(name); break;  // the index still names it
    case 8: {                      // truncated file
      std::string bytes = read_all(kCkpt + "/" + shard);
      bytes.resize(rng() % bytes.size());
      c.write(shard, bytes);
      return label + " truncated to " + std::to_string(bytes.size());
    }
    default: {  // the same name twice (nlohmann would keep only the last)
      std::string hs = h.dump();
      hs.insert(1, json(name).dump() + ":" + h[other].dump() + ",");
      std::string bytes(8, '\0');
      for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((hs.size() >> (8 * i)) & 0xFF);
      c.write(shard, bytes + hs + std::string(data.begin(), data.end()));
      return label + " duplicated";
    }
  }
  fs::remove(c.dir.path / shard);
  k3test::write_safetensors_raw(c.path(shard), h, data);
  return label;
}

// Keys whose absence or corruption must fail for kimi_k3 (everything else has a safe default or is ignored).
const std::vector<std::string> kRequiredText = {
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "rms_norm_eps",
    "hidden_act", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "linear_attn_config", "num_experts",
    "num_experts_per_token", "moe_intermediate_size", "mla_use_output_gate", "attn_res_block_size",
    "routed_expert_hidden_size", "latent_moe_use_norm", "num_shared_experts", "routed_scaling_factor",
    "q_lora_rank", "first_k_dense_replace"};

std::string mutate_config(const CaseDir& c, std::mt19937_64& rng) {
  json j = json::parse(read_all(kCkpt + "/config.json"));
  json& t = j["text_config"];
  const std::string key = kRequiredText[rng() % kRequiredText.size()];
  const int kind = static_cast<int>(rng() % 7);
  std::string label = "config " + key + " kind " + std::to_string(kind);
  switch (kind) {
    case 0: t.erase(key); break;
    case 1: t[key + "x"] = t[key]; t.erase(key); break;  // misspelled
    case 2: t[key] = "seven"; break;
    case 3: t[key] = json::array({1}); break;
    case 4: {  // huge or negative sizes (linear_attn_config gets a huge layer list entry)
      const std::string k = std::vector<std::string>{"num_hidden_layers", "hidden_size", "vocab_size", "num_experts",
                                                      "moe_intermediate_size", "kv_lora_rank"}[rng() % 6];
      t[k] = std::vector<json>{json(1000000000), json(-3), json(1e9), json(int64_t{1} << 40)}[rng() % 4];
      label = "config " + k + " = " + t[k].dump();
      break;
    }
    case 5: {
      const std::string k = std::vector<std::string>{"bos_token_id", "eos_token_id", "pad_token_id"}[rng() % 3];
      j[k] = std::vector<json>{json(1024), json(-2), json(4294967296), json(1.5)}[rng() % 4];
      label = "config " + k + " = " + j[k].dump();
      break;
    }
    default: {
      json& la = t["linear_attn_config"];
      const std::string k = std::vector<std::string>{"kda_layers", "full_attn_layers", "num_heads", "head_dim",
                                                      "gate_lower_bound", "use_full_rank_gate"}[rng() % 6];
      if (rng() % 2) la.erase(k); else la[k] = json::array({0, 99});
      label = "config linear_attn_config." + k;
    }
  }
  c.write("config.json", j.dump());
  return label;
}

std::string mutate_index(const CaseDir& c, std::mt19937_64& rng) {
  json j = json::parse(read_all(kCkpt + "/model.safetensors.index.json"));
  auto& wm = j["weight_map"];
  auto it = wm.begin();
  std::advance(it, static_cast<long>(rng() % wm.size()));
  const int kind = static_cast<int>(rng() % 6);
  const std::vector<std::string> bad_names = {"../../etc/passwd", "/etc/passwd", "..", "", "sub/x.safetensors",
                                              "missing.safetensors"};
  switch (kind) {
    case 0: *it = bad_names[rng() % bad_names.size()]; break;
    case 1: *it = kShards[(std::find(kShards.begin(), kShards.end(), it->get<std::string>()) - kShards.begin() + 1) % 3]; break;
    case 2: wm["language_model.model.nonexistent.weight"] = kShards[0]; break;
    case 3: j["weight_map"] = json::array(); break;
    case 4: j.erase("weight_map"); break;
    default: *it = 7; break;
  }
  c.write("model.safetensors.index.json", j.dump());
  return "index kind " + std::to_string(kind);
}

// Special files in place of the loader's inputs: a FIFO would block open() forever, a symlink
// loop makes std::filesystem throw its own exception type, a 0-byte shard has no header.
std::string mutate_special_file(const CaseDir& c, std::mt19937_64& rng) {
  const std::vector<std::string> targets = {"config.json", "model.safetensors.index.json", kShards[0], kShards[2]};
  const std::string f = targets[rng() % targets.size()];
  fs::remove(c.dir.path / f);
  switch (rng() % 4) {
    case 0: ::mkfifo(c.path(f).c_str(), 0600); return f + " fifo";
    case 1: fs::create_symlink(c.path(f), c.path(f)); return f + " symlink loop";
    case 2: std::ofstream(c.path(f)); return f + " empty";
    default: fs::create_directory(c.path(f)); return f + " directory";
  }
}

}  // namespace

TEST(CheckpointMutation, EveryMutationEndsInAClearError) {
  std::mt19937_64 rng(20240611);
  ASSERT_EQ(error_of([] { load_checkpoint(kCkpt); }), "") << "the unmodified checkpoint must load";
  // What the seeded draw covered: every mutation family, and every kind of shard mutation (the
  // mutate_shard switch). Without this a change of the seed or of the draws could leave a family unrun.
  std::array<int, 4> per_family{};
  std::set<int> shard_kinds;
  for (int i = 0; i < 320; ++i) {
    CaseDir c(kCkpt);
    std::string label;
    switch (rng() % 5) {
      case 0: case 1:
        label = mutate_shard(c, rng);
        ++per_family[0];
        shard_kinds.insert(std::stoi(label.substr(label.find(" kind ") + 6)));
        break;
      case 2: label = mutate_config(c, rng); ++per_family[1]; break;
      case 3: label = mutate_index(c, rng); ++per_family[2]; break;
      default: label = mutate_special_file(c, rng); ++per_family[3];
    }
    testing::internal::CaptureStderr();  // unknown-key warnings of the misspelling cases
    const std::string err = error_of([&] { load_checkpoint(c.dir.str()); });
    testing::internal::GetCapturedStderr();
    EXPECT_NE(err, "") << "case " << i << " (" << label << ") loaded without an error";
    if (std::getenv("K3_MUTATION_VERBOSE"))  // by hand: every case's label and message
      std::cout << label << "\n    -> " << err.substr(0, err.find('\n', 200)) << "\n";
  }
  for (size_t f = 0; f < per_family.size(); ++f) EXPECT_GE(per_family[f], 30) << "mutation family " << f;
  EXPECT_EQ(shard_kinds.size(), 10u) << "not every kind of shard mutation was drawn";
}

TEST(CheckpointMutation, TokenizerFileMutationsEndInAClearError) {
  std::mt19937_64 rng(7);
  ASSERT_EQ(error_of([] { k3::text::Tokenizer::load(kTok); }), "");
  const std::string model = read_all(kTok + "/tiktoken.model");
  const json cfg = json::parse(read_all(kTok + "/tokenizer_config.json"));
  for (int i = 0; i < 120; ++i) {
    CaseDir c(kTok);
    std::string label;
    if (rng() % 2) {
      std::vector<std::string> lines;
      std::istringstream ss(model);
      for (std::string l; std::getline(ss, l);) lines.push_back(l);
      std::string& l = lines[rng() % lines.size()];
      const int kind = static_cast<int>(rng() % 6);
      label = "tiktoken.model kind " + std::to_string(kind);
      switch (kind) {
        case 0: l = "!!!" + l; break;                                // bad base64
        case 1: l = l.substr(0, l.find(' ')) + " 0"; break;          // duplicate rank
        case 2: l = l.substr(0, l.find(' ')) + " 99999999"; break;   // rank far past the table
        case 3: l = l.substr(0, l.find(' ')); break;                 // missing rank
        case 4: l = lines[(&l - lines.data() + 1) % lines.size()]; break;  // duplicate token and rank
        default: l = l.substr(0, l.find(' ')) + " -4"; break;
      }
      std::string out;
      for (auto& x : lines) out += x + "\n";
      c.write("tiktoken.model", out);
    } else {
      json j = cfg;
      auto& added = j["added_tokens_decoder"];
      const int kind = static_cast<int>(rng() % 6);
      label = "tokenizer_config kind " + std::to_string(kind);
      switch (kind) {
        case 0: added["768x"] = added["768"]; break;
        case 1: added["999999999999"] = added["768"]; break;
        case 2: added["800"] = {{"content", std::string(1 << 20, '<')}}; break;
        case 3: added["801"] = added["768"]; break;  // same text twice
        case 4: added["802"] = {{"content", 5}}; break;
        default: j["bos_token"] = "<not a special token>"; break;
      }
      c.write("tokenizer_config.json", j.dump());
    }
    const std::string err = error_of([&] { k3::text::Tokenizer::load(c.dir.str()); });
    EXPECT_NE(err, "") << "case " << i << " (" << label << ") loaded without an error";
  }
}
