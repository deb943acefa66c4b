// Every collective of meshtest, in one include.
#pragma once

#include "dist/ccl/all_gather.hpp"
#include "dist/ccl/all_reduce.hpp"
#include "dist/ccl/all_to_all.hpp"
#include "dist/ccl/broadcast.hpp"
#include "dist/ccl/reduce_scatter.hpp"
