// Fuzz target ccl_bench_json: parse_ccl_bench_json (what meshtest-report plot-ccl reads).
// measurements.json has no reader in meshtest (only a writer): this is the nearest JSON reader.
#include "src/perf/plot.hpp"
#include "tests/fuzz/fuzz_target.hpp"

using namespace meshtest;

MESHTEST_FUZZ_TARGET(in) {
  const std::vector<perf::CclBenchRow> rows = perf::parse_ccl_bench_json(in.text(), "fuzz.json");
  fuzz::require(!rows.empty(), "a parsed bench file has rows");
  for (const perf::CclBenchRow& r : rows) {
    fuzz::require(r.bytes > 0, "every row's bytes are > 0");
    fuzz::touch(std::as_bytes(std::span(r.op)));
    fuzz::touch(std::as_bytes(std::span(r.dtype)));
  }
}
