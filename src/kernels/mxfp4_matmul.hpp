// The MXFP4 expert matmul family (see src/kernels/mxfp4_matmul.cpp for the versions).
#pragma once

#include "src/kernels/family.hpp"

namespace meshtest::kernels {

Tensor mxfp4_matmul_reference(const Inputs& in);
Tensor mxfp4_matmul_v1(const Inputs& in);
Tensor mxfp4_matmul_v2(const Inputs& in);
Tensor mxfp4_matmul_v3(const Inputs& in);

Family mxfp4_matmul_family();

}  // namespace meshtest::kernels
