#include "engine/text/jinja/render_budget.hpp"

#include "engine/text/jinja/errors.hpp"
#include "engine/text/jinja/values.hpp"

namespace tessera::jinja::detail {

namespace {
[[noreturn]] void fail_limit(const std::string& message) { fail(chat_template_error_kind::limit, message); }
}  // namespace

void render_budget::spend(uint64_t steps) {
  steps_ += steps;
  if (steps_ > lim_.max_steps)
    fail_limit("chat template exceeded the work budget (" + std::to_string(lim_.max_steps) + " steps)");
}

void render_budget::check_size(size_t bytes) const {
  if (bytes > lim_.max_output_bytes)
    fail_limit("chat template exceeded the output size limit (" + std::to_string(lim_.max_output_bytes) + " bytes)");
}

void render_budget::check_depth(const value& v) const {
  if (depth_of(v) > lim_.max_depth)
    fail_limit("chat template built a value nested deeper than " + std::to_string(lim_.max_depth) + " levels");
}

value render_budget::make_string(std::string s) {
  check_size(s.size());
  spend(1 + s.size() / 64);
  return value::string(std::move(s));
}

value render_budget::make_list(std::vector<value> items, bool is_tuple) {
  spend(1 + items.size());
  value v = value::make_list(std::move(items), is_tuple);
  check_depth(v);
  return v;
}

value render_budget::make_dict(std::vector<std::pair<value, value>> entries) {
  spend(1 + entries.size());
  value v = value::make_dict(std::move(entries));
  check_depth(v);
  return v;
}

render_budget::recursion_guard::recursion_guard(render_budget& budget) : budget_(budget) {
  if (++budget_.depth_ > budget_.lim_.max_depth)
    fail_limit("chat template exceeded the recursion depth limit (" + std::to_string(budget_.lim_.max_depth) + ")");
}

}  // namespace tessera::jinja::detail
