#include "k3/io/regular_file.h"

#include <cstdint>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "k3/core/error.h"

namespace k3 {

int open_regular_file(const std::string& path, const std::string& what, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error("cannot open " + what + " '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error("cannot stat " + what + " '" + path + "': " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(what + " '" + path + "' is not a regular file");
  }
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, size_t max_bytes, const std::string& what) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, what, &size);
  if (size > max_bytes) {
    ::close(fd);
    throw Error(what + " '" + path + "' is " + std::to_string(size) + " bytes, more than the " +
                std::to_string(max_bytes) + " this loader accepts");
  }
  std::string data(static_cast<size_t>(size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      throw Error("cannot read " + what + " '" + path + "': " + (n == 0 ? "file shrank" : std::strerror(e)));
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return data;
}

}  // namespace k3
