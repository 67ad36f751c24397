// The step message a sharded model's rank 0 broadcasts (dist/step_wire.h): any bytes either decode into a
// message that encodes back to exactly the same bytes, or throw k3::Error (truncated, a count past the
// end, an unknown kind, trailing bytes); never a crash or an allocation larger than the input implies.
#include <cstdlib>
#include <span>
#include <vector>

#include "k3/core/error.h"
#include "k3/dist/step_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const k3::dist::StepMessage m = k3::dist::decode(std::span(data, size));
    const std::vector<uint8_t> again = k3::dist::encode(m);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  } catch (const k3::Error&) {
  }
  return 0;
}
