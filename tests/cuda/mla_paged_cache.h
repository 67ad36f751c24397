// A paged MLA latent cache for the CUDA MLA tests, in MlaPaging's layout (backend/cuda/mla_paging.h): each
// page holds `page` tokens x `layers` MLA layers, layer-major, layer_stride = page * row_bytes rounded up to
// 16 plus 16 (so a kernel that computes the stride itself instead of reading it lands on wrong bytes);
// the pages of a sequence are stored in reverse order (the page table matters) and each sequence has its
// own page size. The host image starts as 0xFF bytes everywhere (NaN for fp32 / bf16, the NaN code for
// e4m3), so a kernel that reads a row of another layer, or a row past the context, poisons its output.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/mla_cache_rows.h"
#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/mla_paging.h"
#include "k3/core/cache_dtype.h"

namespace k3_test {

struct MlaSeqShape {
  int len, page;  // tokens in the cache, tokens per page
};

template <typename T>
k3::cuda::DeviceBuffer mla_upload(const std::vector<T>& v) {
  k3::cuda::DeviceBuffer b(std::max<size_t>(1, v.size()) * sizeof(T));
  K3_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

class MlaPagedCache {
 public:
  MlaPagedCache(k3::CacheDType dtype, int kr, int dr, int layers, const std::vector<MlaSeqShape>& seqs)
      : dtype_(dtype), kr_(kr), dr_(dr), layers_(layers), row_bytes_(k3::mla_row_bytes(dtype, kr, dr)) {
    for (const MlaSeqShape& s : seqs) {
      const int np = (s.len + s.page - 1) / s.page;
      const int64_t stride = (s.page * row_bytes_ + 15) / 16 * 16 + 16;
      page_start_.push_back(static_cast<int32_t>(page_off_.size()));
      page_tokens_.push_back(s.page);
      layer_stride_.push_back(stride);
      for (int p = 0; p < np; ++p) page_off_.push_back(0);
      for (int p = np - 1; p >= 0; --p) {  // page p of the sequence at the next free spot, last page first
        page_off_[static_cast<size_t>(page_start_.back() + p)] = bytes_;
        bytes_ += stride * layers;
      }
      lens_.push_back(s.len);
    }
    host_.assign(static_cast<size_t>(bytes_), 0xFF);
    dev_ = k3::cuda::DeviceBuffer(static_cast<size_t>(std::max<int64_t>(bytes_, 16)));
    std::vector<uint8_t*> ptrs;
    for (int64_t off : page_off_) ptrs.push_back(dev_.get<uint8_t>() + off);
    dpages_ = mla_upload(ptrs);
    dps_ = mla_upload(page_start_);
    dpt_ = mla_upload(page_tokens_);
    dls_ = mla_upload(layer_stride_);
  }

  // Byte offset of row (layer, pos) of sequence seq in the image (MlaPaging's formula).
  int64_t row_offset(int layer, int seq, int pos) const {
    const int pt = page_tokens_[static_cast<size_t>(seq)];
    return page_off_[static_cast<size_t>(page_start_[static_cast<size_t>(seq)] + pos / pt)] +
           layer * layer_stride_[static_cast<size_t>(seq)] + static_cast<int64_t>(pos % pt) * row_bytes_;
  }

  // Encodes random latents (normal, sd 1; with vary_magnitude row pos scaled by 2^(pos % 9 - 4)) into every
  // row of `layer` (cpu::mla_encode_row) and uploads the image.
  void fill_layer_random(int layer, uint64_t seed, bool vary_magnitude = false) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> lat(static_cast<size_t>(kr_ + dr_));
    for (size_t s = 0; s < lens_.size(); ++s)
      for (int pos = 0; pos < lens_[s]; ++pos) {
        const float mag = vary_magnitude ? std::ldexp(1.f, pos % 9 - 4) : 1.f;
        for (float& x : lat) x = nd(rng) * mag;
        k3::cpu::mla_encode_row(dtype_, kr_, dr_, lat.data(), host_.data() + row_offset(layer, static_cast<int>(s), pos));
      }
    upload_image();
  }
  void upload_image() { K3_CUDA_CHECK(cudaMemcpy(dev_.get(), host_.data(), host_.size(), cudaMemcpyHostToDevice)); }
  std::vector<uint8_t> download_image() const {
    std::vector<uint8_t> img(host_.size());
    K3_CUDA_CHECK(cudaMemcpy(img.data(), dev_.get(), img.size(), cudaMemcpyDeviceToHost));
    return img;
  }

  // The host rows 0..len-1 of (layer, seq), for the CPU references.
  std::vector<const void*> host_rows(int layer, int seq) const {
    std::vector<const void*> rows;
    for (int pos = 0; pos < lens_[static_cast<size_t>(seq)]; ++pos) rows.push_back(host_.data() + row_offset(layer, seq, pos));
    return rows;
  }

  k3::cuda::MlaPaging paging(int layer, const int32_t* tok_seq, const int32_t* tok_pos,
                             const int32_t* tok_index = nullptr) const {
    k3::cuda::MlaPaging pg{dpages_.get<uint8_t* const>(), dps_.get<int32_t>(), dpt_.get<int32_t>(),
                           dls_.get<int64_t>(), tok_seq, tok_pos, layer, kr_, dr_, dtype_};
    pg.tok_index = tok_index;
    return pg;
  }

  k3::CacheDType dtype() const { return dtype_; }
  int64_t row_bytes() const { return row_bytes_; }
  std::vector<uint8_t>& host() { return host_; }

 private:
  k3::CacheDType dtype_;
  int kr_, dr_, layers_;
  int64_t row_bytes_, bytes_ = 0;
  std::vector<int64_t> page_off_, layer_stride_;
  std::vector<int32_t> page_start_, page_tokens_;
  std::vector<int> lens_;
  std::vector<uint8_t> host_;
  k3::cuda::DeviceBuffer dev_, dpages_, dps_, dpt_, dls_;
};

}  // namespace k3_test
