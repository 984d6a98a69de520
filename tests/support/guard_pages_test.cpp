// The guard pages of tests/support/guard_pages.cpp do fault: one element past a vector's end (or, with
// TESSERA_GUARD_PAGES=before, one before its start) kills the process, while every element inside is
// accessible. Built into cpu_kernels_test_guarded with the kernels' tests it vouches for.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

bool guard_before() {
  const char* v = std::getenv("TESSERA_GUARD_PAGES");
  return v != nullptr && std::strcmp(v, "before") == 0;
}

// Through a volatile pointer, so that the compiler keeps the out-of-bounds access it could otherwise
// prove undefined and drop.
float touch(const float* p, std::ptrdiff_t i) {
  const volatile float* q = p;
  return q[i];
}

TEST(guard_pages, every_element_is_accessible) {
  for (size_t n : {1u, 3u, 13u, 1024u, 1025u}) {
    std::vector<float> v(n, 1.0f);
    float sum = 0.0f;
    for (size_t i = 0; i < n; ++i) sum += touch(v.data(), static_cast<std::ptrdiff_t>(i));
    EXPECT_EQ(sum, static_cast<float>(n));
  }
}

TEST(guard_pagesDeathTest, one_element_beyond_the_guarded_end_faults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (size_t n : {1u, 13u, 1025u}) {
    std::vector<float> v(n, 1.0f);
    const std::ptrdiff_t outside = guard_before() ? -1 : static_cast<std::ptrdiff_t>(n);
    EXPECT_DEATH(touch(v.data(), outside), "") << "n = " << n;
  }
}

}  // namespace
