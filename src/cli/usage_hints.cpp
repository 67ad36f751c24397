#include "cli/usage_hints.h"

#include <algorithm>

#include "k3/core/edit_distance.h"

namespace k3cli {

namespace {

// The nearest of `known` to `typed`: within 2 edits and half its length (1 for short words); "" if none.
std::string nearest(const std::string& typed, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = 3;
  for (const std::string& k : known) {
    const size_t d = k3::edit_distance(typed, k);
    if (d < best_d && d <= std::max<size_t>(1, typed.size() / 2)) best = k, best_d = d;
  }
  return best;
}

std::vector<std::string> flag_names(const CLI::App& cmd) {
  std::vector<std::string> names;
  for (const CLI::Option* o : cmd.get_options()) {
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

}  // namespace

std::string usage_hint(CLI::App& app, const std::vector<std::string>& args) {
  if (args.empty()) return "";
  std::vector<std::string> verbs;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) verbs.push_back(s->get_name());
  CLI::App* cmd = nullptr;
  if (std::find(verbs.begin(), verbs.end(), args[0]) != verbs.end()) {
    cmd = app.get_subcommand(args[0]);
  } else if (args[0].empty() || args[0][0] != '-') {
    const std::string v = nearest(args[0], verbs);
    return v.empty() ? "" : "did you mean '" + v + "'?";
  }
  if (!cmd) return "";
  // A verb with its own verbs (bench serve / offline ...): the flags of the one given.
  size_t first = 1;
  if (args.size() > 1)
    for (CLI::App* sub : cmd->get_subcommands([](const CLI::App*) { return true; }))
      if (sub->get_name() == args[1]) cmd = sub, first = 2;
  const std::vector<std::string> flags = flag_names(*cmd);
  std::string hint;
  for (size_t i = first; i < args.size(); ++i) {
    std::string a = args[i].substr(0, args[i].find('='));
    if (a.size() < 2 || a[0] != '-' || std::find(flags.begin(), flags.end(), a) != flags.end()) continue;
    if (const std::string n = nearest(a, flags); !n.empty()) hint += (hint.empty() ? "" : "; ") + ("did you mean '" + n + "' for '" + a + "'?");
  }
  return hint;
}

}  // namespace k3cli
