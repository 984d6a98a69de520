#include "server/prometheus_text.hpp"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace tessera::server {

namespace {

std::string_view type_name(metric_type t) {
  switch (t) {
    case metric_type::counter: return "counter";
    case metric_type::gauge: return "gauge";
    case metric_type::histogram: return "histogram";
  }
  return "untyped";
}

// Shortest text that reads back as the same double ("3", "0.25", "1e-05"); Go's ParseFloat and
// Python's float() take it, and NaN / infinities are spelt as the format wants.
void append_value(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else {
    char digits[32];
    const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, v);
    out.append(digits, ec == std::errc() ? end : digits);
  }
}

// HELP text escapes backslash and newline; label values also the double quote.
void append_escaped(std::string& out, std::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

}  // namespace

void prometheus_text::family(std::string_view name, metric_type type, std::string_view help) {
  if (!families_.emplace(name).second) throw std::logic_error("metric family " + std::string(name) + " written twice");
  name_ = name;
  help_ = help;
  type_ = type;
  header_written_ = false;
}

void prometheus_text::append_label(bool& first, std::string_view name, std::string_view value) {
  out_ += first ? '{' : ',';
  first = false;
  out_.append(name);
  out_ += "=\"";
  append_escaped(out_, value, true);
  out_ += '"';
}

void prometheus_text::sample_of(std::string_view suffix, std::initializer_list<metric_label> labels,
                                const metric_label* extra, double value) {
  if (name_.empty()) throw std::logic_error("a metric sample before its family");
  if (!header_written_) {
    out_ += "# HELP " + name_ + ' ';
    append_escaped(out_, help_, false);
    out_ += "\n# TYPE " + name_ + ' ';
    out_.append(type_name(type_));
    out_ += '\n';
    header_written_ = true;
  }
  out_ += name_;
  out_.append(suffix);
  bool first = true;
  if (!common_.empty()) append_label(first, common_, common_value_);
  for (const metric_label& l : labels) append_label(first, l.name, l.value);
  if (extra) append_label(first, extra->name, extra->value);
  if (!first) out_ += '}';
  out_ += ' ';
  append_value(out_, value);
  out_ += '\n';
}

}  // namespace tessera::server
