// `k3 logits -m DIR --tokens 1,2,3 [--decode] --out FILE.npy`: float32 logits [n_tokens, vocab] for the
// given ids, from one prefill (default) or token by token (--decode).
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_loader.h"
#include "k3/core/error.h"
#include "k3/core/npy.h"
#include "k3/model/model.h"

namespace k3cli {

void add_logits(CLI::App& app, Registry& reg) {
  struct Opts {
    std::string model, out;
    std::vector<int32_t> tokens;
    bool decode = false;
    int chunk = 0;
    DeviceOptions dev;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("logits", "Write float32 logits [n_tokens, vocab] for token ids to a .npy file");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory or GGUF file");
  cmd->add_option("--tokens", o->tokens, "comma-separated token ids")->required()->delimiter(',');
  cmd->add_flag("--decode", o->decode, "run token by token (recurrent KDA, absorbed MLA) instead of one prefill");
  cmd->add_option("--kda-chunk", o->chunk, "KDA chunk size of the prefill form (0: the backend's default, CPU 64, CUDA 32)")->check(CLI::Range(0, 4096));
  cmd->add_option("--out", o->out, "output .npy path")->required();
  add_device_options(cmd, o->dev);
  cmd->callback([&reg, o] {
    reg.action = [o] {
      auto m = load_model(resolve_model_dir(o->model), o->dev);
      const int64_t V = m->config().vocab_size, n = static_cast<int64_t>(o->tokens.size());
      if (n == 0) throw k3::Error("--tokens is empty");
      std::vector<float> all(static_cast<size_t>(n * V)), logits;
      auto st_owner = m->new_cache();
      k3::SequenceCache& st = *st_owner;
      k3::ForwardOptions fo;
      fo.kda_chunk = o->chunk;
      if (o->decode) {
        fo.path = k3::AttnPath::Decode;
        for (int64_t t = 0; t < n; ++t) {
          m->forward(std::span<const int32_t>(&o->tokens[static_cast<size_t>(t)], 1), st, logits, fo);
          std::copy(logits.begin(), logits.end(), all.begin() + t * V);
        }
      } else {
        fo.path = k3::AttnPath::Prefill;
        fo.all_logits = true;
        m->forward(o->tokens, st, all, fo);
      }
      k3::write_npy_f32(o->out, all.data(), {n, V});
      std::fprintf(stderr, "wrote %s [%lld, %lld]\n", o->out.c_str(), (long long)n, (long long)V);
      return 0;
    };
  });
}

}  // namespace k3cli
