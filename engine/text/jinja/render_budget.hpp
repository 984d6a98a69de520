// What one render may spend, per jinja::limits: steps, bytes, recursion and value nesting. Every
// part that does work or builds values during a render charges the one budget of that render.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/text/jinja/jinja_template.hpp"

namespace tessera::jinja::detail {

class render_budget {
 public:
  explicit render_budget(const limits& bounds) : lim_(bounds) {}
  render_budget(const render_budget&) = delete;
  render_budget& operator=(const render_budget&) = delete;

  const limits& bounds() const { return lim_; }

  // Each throws chat_template_error (limit) once its bound is passed.
  void spend(uint64_t steps);
  void check_size(size_t bytes) const;     // a string, or the output, of `bytes` bytes
  void check_depth(const value& v) const;  // a value nested this deep

  // Building strings costs 1 step per 64 bytes, so the budget also bounds how much memory a
  // template can fill with distinct large strings (about 64 MiB at the default budget); lists and
  // dicts cost 1 step per element and may not nest deeper than max_depth.
  value make_string(std::string s);
  value make_list(std::vector<value> items, bool is_tuple = false);
  value make_dict(std::vector<std::pair<value, value>> entries);

  // One level of evaluator recursion, for as long as it lives.
  class recursion_guard {
   public:
    explicit recursion_guard(render_budget& budget);
    ~recursion_guard() { --budget_.depth_; }
    recursion_guard(const recursion_guard&) = delete;
    recursion_guard& operator=(const recursion_guard&) = delete;

   private:
    render_budget& budget_;
  };

 private:
  const limits& lim_;
  uint64_t steps_ = 0;
  size_t depth_ = 0;
};

}  // namespace tessera::jinja::detail
