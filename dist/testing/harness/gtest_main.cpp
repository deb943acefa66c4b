// meshtest::gtest_main's main(): every GoogleTest test on every MPI rank (see harness.hpp).
#include "dist/testing/harness/harness.hpp"

int main(int argc, char** argv) { return meshtest::dist::testing::run_all_tests(argc, argv); }
