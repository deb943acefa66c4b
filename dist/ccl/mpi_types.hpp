// mpi_types: the MPI datatype and op of meshtest's dtypes and reductions, for the MPI path and
// for baselines that call MPI directly (bench, tests).
#pragma once

#include <mpi.h>

#include "dist/ccl/options.hpp"
#include "src/core/dtype.hpp"

namespace meshtest::dist {

/// The MPI datatype of one element: f32 MPI_FLOAT, f64 MPI_DOUBLE, i32 MPI_INT32_T, i64
/// MPI_INT64_T, u8 MPI_UINT8_T, bf16 and f16 a committed 2-byte contiguous type each.
MPI_Datatype mpi_type(DType t);

/// The MPI op of `op` on `t` (avg maps to the sum), for baselines that call MPI's own
/// reductions (bench, tests): bf16 and f16 ops compute each pairwise op in f32 and round.
/// meshtest's CCLs reduce with detail::reduce (reduce.hpp) instead. t must not be u8.
MPI_Op mpi_op(ReduceOp op, DType t);

}  // namespace meshtest::dist
