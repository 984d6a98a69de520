// The exposition writer's rules (server/prometheus_text.hpp): the header lines come with a family's
// first sample, a family written twice is a bug caught at once, label values and help are escaped.
#include "server/prometheus_text.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace tessera::server {
namespace {

TEST(prometheus_text, header_lines_come_with_the_first_sample_only) {
  prometheus_text out;
  out.family("a_total", metric_type::counter, "A counter");
  out.sample({{"k", "v"}}, 3);
  out.sample({{"k", "w"}}, 0.25);
  out.family("empty", metric_type::gauge, "Never sampled");
  out.family("g", metric_type::gauge, "G");
  out.sample({}, 1e-5);
  EXPECT_EQ(out.text(),
            "# HELP a_total A counter\n# TYPE a_total counter\na_total{k=\"v\"} 3\na_total{k=\"w\"} 0.25\n"
            "# HELP g G\n# TYPE g gauge\ng 1e-05\n");
}

TEST(prometheus_text, a_family_written_twice_throws) {
  prometheus_text out;
  out.family("x", metric_type::gauge, "X");
  out.sample({}, 1);
  EXPECT_THROW(out.family("x", metric_type::gauge, "X again"), std::logic_error);
  EXPECT_THROW(prometheus_text().sample({}, 1), std::logic_error) << "a sample before any family";
}

TEST(prometheus_text, escapes_label_values_and_help) {
  prometheus_text out;
  out.family("m", metric_type::gauge, "line\\one\ntwo \"quoted\"");
  out.set_common_label("model_name", "a\"b\\c\nd");
  out.sample({{"pool", "device"}}, 2);
  EXPECT_EQ(out.text(),
            "# HELP m line\\\\one\\ntwo \"quoted\"\n# TYPE m gauge\n"
            "m{model_name=\"a\\\"b\\\\c\\nd\",pool=\"device\"} 2\n");
}

TEST(prometheus_text, histogram_samples_carry_the_suffix_and_le_last) {
  prometheus_text out;
  out.set_common_label("model_name", "m");
  out.family("h_seconds", metric_type::histogram, "H");
  const metric_label le{"le", "+Inf"};
  out.sample_of("_bucket", {}, &le, 4);
  out.sample_of("_count", {}, nullptr, 4);
  EXPECT_EQ(out.text(),
            "# HELP h_seconds H\n# TYPE h_seconds histogram\nh_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 4\n"
            "h_seconds_count{model_name=\"m\"} 4\n");
}

}  // namespace
}  // namespace tessera::server
