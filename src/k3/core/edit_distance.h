// Levenshtein distance between two strings: the "did you mean" of config keys (model/config.cpp) and of
// command-line verbs and flags (cli/usage_hints.cpp).
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace k3 {

inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace k3
