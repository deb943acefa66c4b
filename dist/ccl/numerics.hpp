// numerics: the arithmetic a reduction agrees on (exact or NCCL's, for operands on a GPU).
#pragma once

#include "dist/ccl/agreement.hpp"
#include "dist/ccl/options.hpp"

namespace meshtest::dist::detail {

class Call;

/// The numerics a reduction agrees on like an option (every device must reduce alike), resolved
/// from the call's option n: Numerics::from_env takes MESHTEST_GPU_REDUCE (exact, the default
/// when unset, or nccl). Records a local error in `call` (reported by agree()) for a bad
/// MESHTEST_GPU_REDUCE on GPU memory and for nccl asked of host memory; host paths reduce
/// exactly whatever the value.
AgreedOption numerics_option(Call& call, Numerics n);

}  // namespace meshtest::dist::detail
