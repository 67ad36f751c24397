// Opening the files a model directory names (config.json, tokenizer files, shards) safely: a FIFO or
// device node given in their place would block open()/read() forever, so every file is opened with
// O_NONBLOCK and must be a regular file (fstat S_ISREG) before anything is read.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace k3 {

// Opens `path` read-only and returns its descriptor; throws k3::Error (naming `what` and the path)
// unless it is a regular file. `size` (optional) gets its size from the same fstat. The caller closes it.
int open_regular_file(const std::string& path, const std::string& what, uint64_t* size = nullptr);

// Whole contents of a regular file of at most max_bytes bytes (a bound on what a config or tokenizer
// file can make us allocate); throws k3::Error otherwise.
std::string read_regular_file(const std::string& path, size_t max_bytes, const std::string& what);

}  // namespace k3
