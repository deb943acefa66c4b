// Program cache: signatures (key text, FNV-1a hash), hits and misses, the on/off switch.
#include "src/perf/program_cache.hpp"

#include <gtest/gtest.h>

#include <memory>

namespace meshtest::perf {
namespace test_program_cache {

struct CountPlan : Plan {
  int id = 0;
};

/// A build function that numbers the plans it makes (1, 2, ...).
struct Builder {
  int built = 0;
  std::shared_ptr<CountPlan> operator()() {
    auto p = std::make_shared<CountPlan>();
    p->id = ++built;
    return p;
  }
};

TEST(Signature, KeyAndHash) {
  const Signature a = Signature("all_gather").add("dim", 1).add("x", Shape{2, 3}, DType::f32);
  EXPECT_EQ(a.key(), "all_gather;dim=1;x=f32[2, 3]");
  // FNV-1a 64 reference values (published test vectors): "" and "a".
  EXPECT_EQ(Signature("").hash(), 0xcbf29ce484222325ull);
  EXPECT_EQ(Signature("a").hash(), 0xaf63dc4c8601ec8cull);
  const Signature b = Signature("all_gather").add("dim", 1).add("x", Shape{2, 4}, DType::f32);
  const Signature c = Signature("all_gather").add("dim", 1).add("x", Shape{2, 3}, DType::bf16);
  EXPECT_NE(a.hash(), b.hash());
  EXPECT_NE(a.hash(), c.hash());
  EXPECT_EQ(a.hash(),
            Signature("all_gather").add("dim", 1).add("x", Shape{2, 3}, DType::f32).hash());
}

TEST(ProgramCache, HitsAndMisses) {
  ProgramCache cache;
  Builder build;
  const Signature s1 = Signature("op").add("n", 1), s2 = Signature("op").add("n", 2);
  EXPECT_EQ(cache.get<CountPlan>(s1, build)->id, 1);
  EXPECT_EQ(cache.get<CountPlan>(s1, build)->id, 1);  // the same plan, not rebuilt
  EXPECT_EQ(cache.get<CountPlan>(s2, build)->id, 2);
  EXPECT_EQ(cache.get<CountPlan>(s2, build)->id, 2);
  EXPECT_EQ(cache.get<CountPlan>(s1, build)->id, 1);
  EXPECT_EQ(build.built, 2);
  EXPECT_EQ(cache.misses(), 2);
  EXPECT_EQ(cache.hits(), 3);
  EXPECT_EQ(cache.size(), 2u);
  cache.clear();
  EXPECT_EQ(cache.hits() + cache.misses(), 0);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.get<CountPlan>(s1, build)->id, 3);  // rebuilt after clear()
}

TEST(ProgramCache, SwitchedOffBuildsEveryTime) {
  ProgramCache cache;
  Builder build;
  const Signature s = Signature("op").add("n", 1);
  cache.get<CountPlan>(s, build);
  cache.set_enabled(false);
  EXPECT_EQ(cache.size(), 0u);  // switching off drops the plans
  EXPECT_EQ(cache.get<CountPlan>(s, build)->id, 2);
  EXPECT_EQ(cache.get<CountPlan>(s, build)->id, 3);
  EXPECT_EQ(cache.hits(), 0);
  EXPECT_EQ(cache.misses(), 3);
  EXPECT_EQ(cache.size(), 0u);
  cache.set_enabled(true);
  EXPECT_EQ(cache.get<CountPlan>(s, build)->id, 4);
  EXPECT_EQ(cache.get<CountPlan>(s, build)->id, 4);
  EXPECT_EQ(cache.hits(), 1);
}

TEST(ProgramCache, CapacityBoundsTheCache) {
  ProgramCache cache;
  cache.set_capacity(2);
  Builder build;
  for (int n = 0; n < 5; ++n) cache.get<CountPlan>(Signature("op").add("n", n), build);
  EXPECT_LE(cache.size(), 2u);
  EXPECT_EQ(cache.misses(), 5);
  // The most recent plan was kept: a hit.
  EXPECT_EQ(cache.get<CountPlan>(Signature("op").add("n", 4), build)->id, 5);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_THROW(cache.set_capacity(0), Error);
}

TEST(ProgramCache, ScopedSwitchRestores) {
  ASSERT_TRUE(program_cache().enabled());
  {
    const ProgramCacheSwitch off(false);
    EXPECT_FALSE(program_cache().enabled());
  }
  EXPECT_TRUE(program_cache().enabled());
}

}  // namespace test_program_cache
}  // namespace meshtest::perf
