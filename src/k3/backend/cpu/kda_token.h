// One token of one head of the KDA recurrence (fp32 arithmetic on an fp32 or a bf16 state): the step
// kda_recurrent_head / kda_recurrent_head_typed (kda.h) run per token, with the decay dg = exp(g) already computed.
//   S' = diag(dg) S;  u = S'^T k;  delta = beta (v - u);  S = S' + k delta^T;  o = S^T q
// Layouts: S [D][D] (S[dk][dv]), q, k, v, dg, o [D].
//
// The kernels give the same bits: every element sees the reference loops' operations in their order --
// S'[dk][j] = dg[dk] * S[dk][j] rounded; u[j] and o[j] one fma per row dk, dk ascending, from +0;
// delta[j] = beta * (v[j] - u[j]); S[dk][j] = fma(k[dk], delta[j], S'[dk][j]). Only the loop nest differs: the
// vector kernels keep u and o (AVX-512: delta too) in registers over a block of columns (the reference loads and
// stores u and o for every row: three times the memory operations, ~2.5x the time with the state in L2) and only
// read S in the first pass, computing dg S again in the second instead of storing it (a store per element saved for
// a multiply; columns are independent, so each block runs both passes while its rows are in L1 / L2).
#pragma once
#include <cstdint>
#include <optional>

namespace k3::cpu {

enum class KdaTokenKernel {
  Reference,  // the loops kda.cpp always had; any D
  Avx2,       // 8-lane blocks of 64 columns; D % 8 == 0
  Avx512,     // 16-lane blocks of 128 columns (a whole row of a D = 128 head); D % 16 == 0, an AVX-512 CPU tier
};

// Whether `kernel` can run head dim D on this CPU (Avx512: the CPU has AVX-512F, whatever the chosen tier).
bool kda_token_kernel_runs(KdaTokenKernel kernel, int D);

// The kernel kda_recurrent_head runs for D: Avx512 where it runs and the CPU tier (cpu_isa.h) is avx512 or above,
// else Avx2 where it runs, else Reference; a kernel forced for tests instead where it runs D.
KdaTokenKernel kda_token_kernel(int D);

// The step with `kernel` (which must run D); scratch: D floats.
void kda_token_step(KdaTokenKernel kernel, int D, const float* q, const float* k, const float* v, const float* dg,
                    float beta, float* S, float* o, float* scratch);

// The step on a bf16 state [D][D], rounded to nearest even when stored: the bits of widening S, kda_token_step and
// rounding back (what kda_recurrent_head_typed did per token), the vector kernels widening and rounding in registers
// (half the state bytes, no fp32 copy). scratch: D floats; wide: D * D floats (the Reference kernel's fp32 copy).
void kda_token_step_bf16(KdaTokenKernel kernel, int D, const float* q, const float* k, const float* v, const float* dg,
                         float beta, uint16_t* S, float* o, float* scratch, float* wide);

// Tests: kda_token_kernel answers `kernel` wherever it runs D (nullopt: the automatic choice again).
void force_kda_token_kernel_for_testing(std::optional<KdaTokenKernel> kernel);

}  // namespace k3::cpu
