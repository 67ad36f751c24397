#include "k3/backend/cuda/expert_streamer.h"

#include <cstring>

#include "k3/backend/cuda/quant_tables.h"
#include "k3/core/mxfp4_ggml.h"
#include "k3/core/thread_pool.h"
#include "k3/core/weight_format.h"

namespace k3::cuda {

namespace {

std::atomic<double> g_bytes_uploaded{0};

// One projection of the stack: bytes of each expert's packed rows and of its block scales.
struct ProjectionLayout {
  size_t data = 0, scales = 0;
};

// The device's format of a stored one: ggml's MXFP4 blocks go up as the HF layout (packed nibbles + a scale
// array: the MXFP4 kernels' input, the same values), everything else as stored.
WeightFormat device_format(WeightFormat f) { return f == WeightFormat::MXFP4_GGML ? WeightFormat::MXFP4 : f; }

ProjectionLayout layout_of(const WeightMatrix& m) {
  const WeightFormat f = device_format(m.format);
  if (is_block_format(f))
    return {static_cast<size_t>(m.rows * row_data_bytes(f, m.cols)), static_cast<size_t>(m.rows * row_scale_bytes(f, m.cols))};
  return {static_cast<size_t>(m.rows * m.cols) * 2, 0};  // bf16
}

// One expert matrix into its place in the pinned stack (data at `data`, scales at `scales`).
void stage(const WeightMatrix& m, const ProjectionLayout& lay, uint8_t* data, uint8_t* scales) {
  if (m.format == WeightFormat::MXFP4_GGML) {
    ggml_blocks_to_mxfp4(static_cast<const uint8_t*>(m.data), m.rows * m.cols / kMxfp4Group, data, scales);
    return;
  }
  std::memcpy(data, m.data, lay.data);
  if (lay.scales) std::memcpy(scales, m.scales, lay.scales);
}

}  // namespace

double ExpertStreamer::total_bytes_uploaded() { return g_bytes_uploaded.load(); }

bool ExpertStreamer::can_stream(const std::vector<GluMlp>& experts) {
  if (experts.empty()) return false;
  const WeightFormat f = experts[0].gate.format, fd = experts[0].down.format;
  // MXFP4 (either layout), BF16, or GGUF blocks (gate / up in one format, the downs in one GGUF format that may
  // differ: llama-quantize's Q4_K_M gives some layers Q6_K downs), as the grouped kernels take them resident.
  const bool gguf = is_gguf_block(f) && is_gguf_block(fd);
  if (f != WeightFormat::MXFP4 && f != WeightFormat::MXFP4_GGML && f != WeightFormat::BF16 && !gguf) return false;
  if (gguf && (experts[0].gate.cols % weight_layout(f).block_elems != 0 || experts[0].down.cols % weight_layout(fd).block_elems != 0))
    return false;
  for (const GluMlp& e : experts)
    for (const WeightMatrix* m : {&e.gate, &e.up, &e.down})
      if (m->format != (m == &e.down ? (gguf ? fd : f) : f) || m->data == nullptr ||
          m->rows != (m == &e.down ? experts[0].down.rows : experts[0].gate.rows) ||
          m->cols != (m == &e.down ? experts[0].down.cols : experts[0].gate.cols) ||
          (is_gguf_block(m->format) && m->scales != nullptr))
        return false;
  return true;
}

ExpertBank ExpertStreamer::upload(const std::vector<GluMlp>& experts, cudaStream_t stream) {
  const GluMlp& e0 = experts[0];
  const size_t E = experts.size();
  const ProjectionLayout lg = layout_of(e0.gate), lu = layout_of(e0.up), ld = layout_of(e0.down);
  // Stack order in the buffer: gate data, gate scales, up data, up scales, down data, down scales.
  const size_t off[6] = {0, E * lg.data, E * (lg.data + lg.scales), E * (lg.data + lg.scales + lu.data),
                         E * (lg.data + lg.scales + lu.data + lu.scales),
                         E * (lg.data + lg.scales + lu.data + lu.scales + ld.data)};
  const size_t total = E * (lg.data + lg.scales + lu.data + lu.scales + ld.data + ld.scales);
  if (copy_pending_) K3_CUDA_CHECK(cudaEventSynchronize(copied_.get()));  // the pinned buffer is free again
  uint8_t* h = static_cast<uint8_t*>(pinned_.ensure(total));
  if (device_.bytes() < total) device_ = DeviceBuffer(total);
  // Experts in parallel on the CPU threads: the copy out of the (possibly file-backed) weights is the
  // CPU's share of the stream.
  parallel_for(static_cast<int64_t>(E), true, [&](int64_t e) {
    const GluMlp& x = experts[static_cast<size_t>(e)];
    const WeightMatrix* mats[3] = {&x.gate, &x.up, &x.down};
    const ProjectionLayout lays[3] = {lg, lu, ld};
    for (int p = 0; p < 3; ++p)
      stage(*mats[p], lays[p], h + off[2 * p] + static_cast<size_t>(e) * lays[p].data,
            h + off[2 * p + 1] + static_cast<size_t>(e) * lays[p].scales);
  });
  uint8_t* d = device_.get<uint8_t>();
  K3_CUDA_CHECK(cudaMemcpyAsync(d, h, total, cudaMemcpyHostToDevice, stream));
  K3_CUDA_CHECK(cudaEventRecord(copied_.get(), stream));
  copy_pending_ = true;
  g_bytes_uploaded.fetch_add(static_cast<double>(total));
  ExpertBank b;
  b.format = device_format(e0.gate.format);
  b.down_format = device_format(e0.down.format);
  b.E = static_cast<int>(E);
  b.I = static_cast<int>(e0.gate.rows);
  b.X = static_cast<int>(e0.gate.cols);
  b.gate = d + off[0];
  b.up = d + off[2];
  b.down = d + off[4];
  if (lg.scales) {
    b.gate_scales = d + off[1];
    b.up_scales = d + off[3];
    b.down_scales = d + off[5];
  }
  return b;
}

}  // namespace k3::cuda
