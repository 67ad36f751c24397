// The main of k3's GoogleTest binaries. The CPU kernels default to the fastest tier the CPU has, which
// rounds activations where the CPU offers an inexact tier (cpu_isa.h); the goldens, the CPU-vs-GPU
// comparisons and the CLI tests' expected texts are exact fp32 arithmetic, the same on every CI machine. So
// the tests run with K3_CPU_ISA=exact unless the caller set it; tests of a tier force it
// (force_cpu_isa_for_testing), and the `k3` processes the CLI tests start inherit the setting. The CUDA GGUF GEMV's
// one-token rule rounds activations to int8 as the CPU's int8 tiers do (quant_gemv_q8.cu); K3_QUANT_GEMV=exact keeps
// the GPU's side of those comparisons exact too, and the q8 kernel's tests force it (force_quant_gemv_q8_for_testing).
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  setenv("K3_CPU_ISA", "exact", /*overwrite=*/0);
  setenv("K3_QUANT_GEMV", "exact", /*overwrite=*/0);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
