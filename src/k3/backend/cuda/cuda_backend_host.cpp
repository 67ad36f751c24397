// CudaBackend's ops over weights placed on the host (model/placement.h: -ot PATTERN=CPU, --cpu-moe): the
// graph runs each op where its weights live and moves activations, not weights. Here that is: copy the
// inputs to pinned host memory, synchronise, run the CPU backend's kernel, copy the result back. Simple
// and correct. The routed experts' jobs overlap the GPU's shared experts and, in decode steps, run between
// the pieces of a captured CUDA graph (begin_host_cuts, cuda_model.cpp: docs/perf/hybrid.md).
#include <chrono>
#include <cstring>

#include "k3/core/error.h"

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cuda/cuda_backend.h"

namespace k3::cuda {

using graph::Tensor;

namespace {
size_t bytes_of(const Tensor& t) { return static_cast<size_t>(t.rows * t.stride) * 4; }
}  // namespace

void CudaBackend::host_linear(const WeightMatrix& W, Tensor x, Tensor y) {
  if (cuts_) throw Error("CUDA backend: a host-placed dense weight inside a captured step (cannot be graphed)");
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
  if (cuts_) throw Error("CUDA backend: a host-placed embedding inside a captured step (cannot be graphed)");
  K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  float* h = static_cast<float*>(host_out_.ensure(bytes_of(out)));
  for (int64_t t = 0; t < out.rows; ++t) cpu::dequant_row(table, plan_->tokens[static_cast<size_t>(t)], h + t * out.stride);
  K3_CUDA_CHECK(cudaMemcpyAsync(out.data, h, bytes_of(out), cudaMemcpyHostToDevice, stream_));
}

// The routed experts of a host-placed layer, in two halves so that the GPU runs the shared experts while
// the CPU computes (moe_experts_start / moe_experts_wait, graph/backend.h): the start queues the inputs'
// download and an event behind them; the finish waits for that event only (not the shared experts
// queued since), runs the CPU kernels and queues the upload. Own pinned buffers: a host-placed shared
// expert in between uses host_in_/host_out_.
void CudaBackend::host_moe_start(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const graph::GluParams& p,
                                 Tensor out) {
  if (w.experts.empty()) throw Error("CUDA backend: the layer has no routed experts");
  const size_t bx = bytes_of(x), bi = bytes_of(idx), bw = bytes_of(wts);
  uint8_t* in = static_cast<uint8_t*>(moe_in_.ensure(bx + bi + bw));
  K3_CUDA_CHECK(cudaMemcpyAsync(in, x.data, bx, cudaMemcpyDeviceToHost, stream_));
  K3_CUDA_CHECK(cudaMemcpyAsync(in + bx, idx.data, bi, cudaMemcpyDeviceToHost, stream_));
  K3_CUDA_CHECK(cudaMemcpyAsync(in + bx + bi, wts.data, bw, cudaMemcpyDeviceToHost, stream_));
  // In a captured piece the record must be a graph node that fires at replay (External), not only a
  // capture-time dependency marker.
  K3_CUDA_CHECK(cudaEventRecordWithFlags(moe_inputs_ready_.get(), stream_, cuts_ ? cudaEventRecordExternal : 0));
  Tensor hx = x, hi = idx, hw = wts;
  hx.data = in;
  hi.data = in + bx;
  hw.data = in + bx + bi;
  pending_moe_ = PendingHostMoe{&w, hx, hi, hw, p, out};
}

void CudaBackend::host_moe_finish() {
  if (!pending_moe_) return;
  const PendingHostMoe m = *pending_moe_;
  pending_moe_.reset();
  if (!host_cpu_) {
    auto cpu = std::make_unique<cpu::CpuBackend>();
    cpu->set_expert_residency(host_residency_);
    cpu->set_moe_activation_dtype(moe_act_);
    host_cpu_ = std::move(cpu);
  }
  Tensor ho = m.out;
  ho.data = moe_out_.ensure(bytes_of(m.out));
  if (cuts_) {
    // Capturing: the job runs at replay, after this piece's launch; the next piece starts with its upload.
    HostCut cut;
    K3_CUDA_CHECK(cudaStreamEndCapture(stream_, &cut.piece));
    cut.host_job = [this, m, ho] { run_host_moe(m, ho); };
    cuts_->push_back(std::move(cut));
    K3_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  } else {
    prof_.begin("host experts", stream_);  // GPU-side: from the shared experts' end to the upload's end
    run_host_moe(m, ho);
  }
  K3_CUDA_CHECK(cudaMemcpyAsync(m.out.data, ho.data, bytes_of(m.out), cudaMemcpyHostToDevice, stream_));
  if (!cuts_) prof_.end(stream_);
}

void CudaBackend::run_host_moe(const PendingHostMoe& m, Tensor out) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  // Also orders the previous layer's upload from moe_out_ before this layer overwrites it.
  K3_CUDA_CHECK(cudaEventSynchronize(moe_inputs_ready_.get()));
  const auto t1 = clock::now();
  host_cpu_->moe_experts(*m.w, m.x, m.idx, m.wts, m.p, out);
  if (prof_.on()) {  // K3_CUDA_PROFILE: where a host expert job's wall time goes, beside the GPU-side regions
    const auto t2 = clock::now();
    prof_.add_host("experts: wait", std::chrono::duration<double, std::milli>(t1 - t0).count());
    prof_.add_host("experts: compute", std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
}

void CudaBackend::moe_experts_start(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const graph::GluParams& p,
                                    Tensor out) {
  if (!w.stacked.empty() || !overlap_host_moe_) return moe_experts(w, x, idx, wts, p, out);
  if (stream_host_experts(w, x, idx, wts, p, out)) return;  // computed on the GPU: nothing to wait for
  host_moe_start(w, x, idx, wts, p, out);
}

bool CudaBackend::stream_host_experts(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const graph::GluParams& p,
                                      Tensor out) {
  if (moe_stream_min_tokens_ <= 0 || x.rows < moe_stream_min_tokens_ || !ExpertStreamer::can_stream(w.experts)) return false;
  prof_.begin("stream experts", stream_);
  const auto t0 = std::chrono::steady_clock::now();
  const ExpertBank bank = streamer_.upload(w.experts, stream_);
  // K3_CUDA_PROFILE: the host's part (waiting for the pinned buffer, staging the experts into it)
  prof_.add_host("stream: stage", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  K3_CUDA_CHECK(cuda::moe_experts(bank, static_cast<int>(x.rows), static_cast<int>(idx.cols), x.f(), idx.i(), wts.f(),
                                  p.situ ? GluAct::SiTU : GluAct::SiLU, p.beta, p.linear_beta, out.f(), *moe_ws_, stream_,
                                  moe_precision()));
  prof_.end(stream_);
  return true;
}

void CudaBackend::moe_experts_wait() { host_moe_finish(); }

}  // namespace k3::cuda
