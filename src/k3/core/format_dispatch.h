// The one switch that turns a runtime GGUF block format into a template argument: kernels are instantiated
// per format (CPU tiers' row kernels, CUDA launchers), and each table that picks them calls this instead of
// listing the formats again.
#pragma once
#include <type_traits>
#include <utility>

#include "k3/core/weight_format.h"

namespace k3 {

// fn(std::integral_constant<WeightFormat, F>{}) for the GGUF block format f; `other` for any other format.
template <class R, class Fn>
R with_gguf_block_format(WeightFormat f, Fn&& fn, R other) {
  using WF = WeightFormat;
  switch (f) {
    case WF::Q8_0: return fn(std::integral_constant<WF, WF::Q8_0>{});
    case WF::Q4_K: return fn(std::integral_constant<WF, WF::Q4_K>{});
    case WF::Q5_K: return fn(std::integral_constant<WF, WF::Q5_K>{});
    case WF::Q6_K: return fn(std::integral_constant<WF, WF::Q6_K>{});
    case WF::Q3_K: return fn(std::integral_constant<WF, WF::Q3_K>{});
    case WF::Q2_K: return fn(std::integral_constant<WF, WF::Q2_K>{});
    case WF::IQ4_XS: return fn(std::integral_constant<WF, WF::IQ4_XS>{});
    case WF::IQ3_XXS: return fn(std::integral_constant<WF, WF::IQ3_XXS>{});
    case WF::IQ3_S: return fn(std::integral_constant<WF, WF::IQ3_S>{});
    case WF::IQ2_XXS: return fn(std::integral_constant<WF, WF::IQ2_XXS>{});
    case WF::IQ2_XS: return fn(std::integral_constant<WF, WF::IQ2_XS>{});
    case WF::IQ2_S: return fn(std::integral_constant<WF, WF::IQ2_S>{});
    case WF::IQ1_S: return fn(std::integral_constant<WF, WF::IQ1_S>{});
    case WF::IQ1_M: return fn(std::integral_constant<WF, WF::IQ1_M>{});
    case WF::Q4_0: return fn(std::integral_constant<WF, WF::Q4_0>{});
    case WF::Q4_1: return fn(std::integral_constant<WF, WF::Q4_1>{});
    case WF::Q5_0: return fn(std::integral_constant<WF, WF::Q5_0>{});
    case WF::Q5_1: return fn(std::integral_constant<WF, WF::Q5_1>{});
    case WF::IQ4_NL: return fn(std::integral_constant<WF, WF::IQ4_NL>{});
    default: return other;
  }
}

// The ggml 32-element formats (llama-quantize's fallbacks for rows that are not whole 256-blocks).
constexpr bool is_ggml_32_format(WeightFormat f) {
  return f == WeightFormat::Q4_0 || f == WeightFormat::Q4_1 || f == WeightFormat::Q5_0 || f == WeightFormat::Q5_1 ||
         f == WeightFormat::IQ4_NL;
}

}  // namespace k3
