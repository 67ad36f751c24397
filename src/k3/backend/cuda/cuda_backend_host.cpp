// CudaBackend's ops over weights placed on the host (model/placement.h: -ot PATTERN=CPU, --cpu-moe): the
// graph runs each op where its weights live and moves activations, not weights. Here that is: copy the
// inputs to pinned host memory, synchronise, run the CPU backend's kernel, copy the result back. Simple
// and correct; overlapping the CPU work with the GPU's is the hybrid-offload issue's job.
#include <cstring>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cuda/cuda_backend.h"

namespace k3::cuda {

using graph::Tensor;

namespace {
size_t bytes_of(const Tensor& t) { return static_cast<size_t>(t.rows * t.stride) * 4; }
}  // namespace

void CudaBackend::host_linear(const WeightMatrix& W, Tensor x, Tensor y) {
  prof_.begin("host linear", stream_);
  float* hx = static_cast<float*>(host_in_.ensure(bytes_of(x)));
  K3_CUDA_CHECK(cudaMemcpyAsync(hx, x.data, bytes_of(x), cudaMemcpyDeviceToHost, stream_));
  K3_CUDA_CHECK(cudaStreamSynchronize(stream_));  // also: the last host op's upload has left host_out_
  float* hy = static_cast<float*>(host_out_.ensure(bytes_of(y)));
  cpu::matmul(W, hx, x.rows, hy);
  K3_CUDA_CHECK(cudaMemcpyAsync(y.data, hy, bytes_of(y), cudaMemcpyHostToDevice, stream_));
  prof_.end(stream_);
}

void CudaBackend::host_embed(const WeightMatrix& table, Tensor out) {
  K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  float* h = static_cast<float*>(host_out_.ensure(bytes_of(out)));
  for (int64_t t = 0; t < out.rows; ++t) cpu::dequant_row(table, plan_->tokens[static_cast<size_t>(t)], h + t * out.stride);
  K3_CUDA_CHECK(cudaMemcpyAsync(out.data, h, bytes_of(out), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::host_moe_experts(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const graph::GluParams& p,
                                   Tensor out) {
  prof_.begin("host experts", stream_);
  const size_t bx = bytes_of(x), bi = bytes_of(idx), bw = bytes_of(wts);
  uint8_t* in = static_cast<uint8_t*>(host_in_.ensure(bx + bi + bw));
  K3_CUDA_CHECK(cudaMemcpyAsync(in, x.data, bx, cudaMemcpyDeviceToHost, stream_));
  K3_CUDA_CHECK(cudaMemcpyAsync(in + bx, idx.data, bi, cudaMemcpyDeviceToHost, stream_));
  K3_CUDA_CHECK(cudaMemcpyAsync(in + bx + bi, wts.data, bw, cudaMemcpyDeviceToHost, stream_));
  K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (!host_cpu_) host_cpu_ = std::make_unique<cpu::CpuBackend>();
  Tensor hx = x, hi = idx, hw = wts, ho = out;
  hx.data = in;
  hi.data = in + bx;
  hw.data = in + bx + bi;
  ho.data = host_out_.ensure(bytes_of(out));
  host_cpu_->moe_experts(w, hx, hi, hw, p, ho);
  K3_CUDA_CHECK(cudaMemcpyAsync(out.data, ho.data, bytes_of(out), cudaMemcpyHostToDevice, stream_));
  prof_.end(stream_);
}

}  // namespace k3::cuda
