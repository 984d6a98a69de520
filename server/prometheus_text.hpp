// The Prometheus text exposition format (0.0.4), written family by family. What parsers
// (prometheus_client, promtool, the Prometheus server) need and what hand-written text got wrong
// (issue #19): every sample under its own family's `# HELP` / `# TYPE`, a sample's name being the
// family's (counters are families named `..._total`; histograms add `_bucket`, `_sum`, `_count`),
// no family written twice, and no `# TYPE` line without samples. The header lines are therefore
// written with a family's first sample, and a family started twice throws.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>

namespace tessera::server {

struct metric_label {
  std::string_view name;
  std::string_view value;  // escaped when written (backslash, double quote, newline)
};

enum class metric_type : uint8_t { counter, gauge, histogram };

class prometheus_text {
 public:
  // Starts family `name`; the samples that follow belong to it. Throws std::logic_error when a
  // family of that name was started before.
  void family(std::string_view name, metric_type type, std::string_view help);
  // A sample of the current family: its name plus `suffix` ("" for counters and gauges; "_bucket",
  // "_sum", "_count" for histograms), `labels` then `extra` (a histogram's le), the value.
  void sample(std::initializer_list<metric_label> labels, double value) { sample_of("", labels, {}, value); }
  void sample_of(std::string_view suffix, std::initializer_list<metric_label> labels, const metric_label* extra,
                 double value);
  // A label every sample written after this call carries before its own (the served model's name on
  // the vLLM-style set); an empty name: none.
  void set_common_label(std::string name, std::string value) {
    common_ = std::move(name);
    common_value_ = std::move(value);
  }

  const std::string& text() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void append_label(bool& first, std::string_view name, std::string_view value);

  std::string out_;
  std::set<std::string, std::less<>> families_;
  std::string name_, help_;
  metric_type type_ = metric_type::gauge;
  bool header_written_ = true;
  std::string common_, common_value_;
};

}  // namespace tessera::server
