#include "k3/core/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "k3/core/error.h"

namespace k3 {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::ostringstream hdr;
  hdr << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  size_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    hdr << shape[i] << (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
    n *= static_cast<size_t>(shape[i]);
  }
  hdr << "), }";
  std::string h = hdr.str();
  // magic(6) + version(2) + len(2) + header, padded with spaces to a multiple of 64, ending in '\n'.
  size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open '" + path + "' for writing");
  const char magic[] = "\x93NUMPY\x01\x00";
  f.write(magic, 8);
  uint16_t len = static_cast<uint16_t>(h.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
  if (!f) throw Error("write failed: '" + path + "'");
}

NpyArray read_npy_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open '" + path + "'");
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw Error("'" + path + "' is not a .npy file");
  size_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t l;
    f.read(reinterpret_cast<char*>(&l), 2);
    hlen = l;
  } else {
    uint32_t l;
    f.read(reinterpret_cast<char*>(&l), 4);
    hlen = l;
  }
  std::string h(hlen, '\0');
  f.read(h.data(), static_cast<std::streamsize>(hlen));
  if (!f) throw Error("'" + path + "': truncated header");
  bool f8 = h.find("'<f8'") != std::string::npos;
  if (!f8 && h.find("'<f4'") == std::string::npos) throw Error("'" + path + "': only <f4/<f8 supported");
  if (h.find("'fortran_order': False") == std::string::npos) throw Error("'" + path + "': Fortran order");
  NpyArray a;
  size_t p = h.find('('), q = h.find(')');
  if (p == std::string::npos || q == std::string::npos) throw Error("'" + path + "': no shape");
  std::string dims = h.substr(p + 1, q - p - 1);
  size_t n = 1;
  std::istringstream ds(dims);
  std::string tok;
  while (std::getline(ds, tok, ',')) {
    if (tok.find_first_of("0123456789") == std::string::npos) continue;
    int64_t d = std::stoll(tok);
    a.shape.push_back(d);
    n *= static_cast<size_t>(d);
  }
  a.data.resize(n);
  if (f8) {
    std::vector<double> tmp(n);
    f.read(reinterpret_cast<char*>(tmp.data()), static_cast<std::streamsize>(n * 8));
    for (size_t i = 0; i < n; ++i) a.data[i] = static_cast<float>(tmp[i]);
  } else {
    f.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(n * 4));
  }
  if (!f) throw Error("'" + path + "': truncated data");
  return a;
}

}  // namespace k3
