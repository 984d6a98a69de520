#include "engine/text/jinja/globals.hpp"

#include <cmath>
#include <ctime>

#include "engine/text/jinja/errors.hpp"
#include "engine/text/jinja/methods.hpp"
#include "engine/text/jinja/values.hpp"

namespace tessera::jinja::detail {

namespace {

[[noreturn]] void raise_exception(render_budget& budget, const call_args& args) {
  check_signature("raise_exception", args, {"message"}, true);
  const value* msg = args.get(0, "message");
  fail(chat_template_error_kind::raised, msg ? to_str(budget, *msg) : std::string("raise_exception() called"));
}

value make_namespace(render_budget& budget, const call_args& args) {
  std::vector<std::pair<value, value>> entries;
  auto put = [&](const value& k, const value& v) {
    if (k.kind != value_kind::string) fail_render("namespace() keys must be strings");
    check_namespace_attribute(k.str(), v);
    set_namespace_entry(entries, k, v);
  };
  for (const auto& p : args.positional) {
    if (p.kind != value_kind::dict) fail_render("namespace() positional argument must be a dict");
    for (const auto& [k, v] : p.dict->entries) put(k, v);
  }
  for (const auto& [k, v] : args.keyword) put(value::string(k), v);
  value ns = budget.make_dict(std::move(entries));
  ns.kind = value_kind::ns;
  return ns;
}

value make_dict(render_budget& budget, const call_args& args) {
  std::vector<std::pair<value, value>> entries;
  for (const auto& p : args.positional) {
    if (p.kind != value_kind::dict) fail_render("dict() positional argument must be a dict");
    entries = p.dict->entries;
  }
  for (const auto& [k, v] : args.keyword) {
    bool replaced = false;
    for (auto& [ok, ov] : entries)
      if (ok.kind == value_kind::string && ok.str() == k) {
        ov = v;
        replaced = true;
      }
    if (!replaced) entries.emplace_back(value::string(k), v);
  }
  return budget.make_dict(std::move(entries));
}

value make_range(render_budget& budget, const call_args& args) {
  if (!args.keyword.empty()) fail_render("range() takes no keyword arguments");
  std::vector<int64_t> nums;
  for (const auto& p : args.positional) {
    if (!is_integral(p)) fail_render("range() arguments must be integers");
    nums.push_back(as_int(p));
  }
  if (nums.empty() || nums.size() > 3) fail_render("range() takes 1 to 3 arguments");
  const int64_t start = nums.size() == 1 ? 0 : nums[0];
  const int64_t stop = nums.size() == 1 ? nums[0] : nums[1];
  const int64_t step = nums.size() == 3 ? nums[2] : 1;
  if (step == 0) fail_render("range() arg 3 must not be zero");
  // Jinja's sandbox refuses ranges longer than MAX_RANGE = 100000.
  const long double count = step > 0
                                ? std::ceil((static_cast<long double>(stop) - start) / step)
                                : std::ceil((static_cast<long double>(start) - stop) / -static_cast<long double>(step));
  if (count > 100000)
    fail(chat_template_error_kind::limit, "chat template range() is too big (more than 100000 items)");
  // Near the int64 limits `k += step` overflows (undefined behaviour) before the end test could stop
  // the loop: an overflowing step has left [start, stop) anyway, so it ends the range.
  std::vector<value> items;
  for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
    items.push_back(value::integer(k));
    if (__builtin_add_overflow(k, step, &k)) break;
  }
  return budget.make_list(std::move(items));
}

value strftime_now(render_budget& budget, const call_args& args, int64_t now_unix_seconds) {
  check_signature("strftime_now", args, {"format"}, true);
  const value* fmt = args.get(0, "format");
  if (!fmt || fmt->kind != value_kind::string) fail_render("strftime_now() needs a format string");
  if (fmt->s->size() > 256) fail_render("strftime_now() format is too long");
  // transformers formats datetime.now(), a naive datetime: %z and %Z are empty, %f is the
  // microsecond (always 0 with our one-second clock). Everything else is C strftime, as in CPython.
  std::string c_format;
  const std::string& f = fmt->str();
  for (size_t k = 0; k < f.size(); ++k) {
    if (f[k] == '%' && k + 1 < f.size()) {
      const char conv = f[k + 1];
      ++k;
      if (conv == 'f')
        c_format += "000000";
      else if (conv != 'z' && conv != 'Z') {
        c_format += '%';
        c_format += conv;
      }
    } else {
      c_format += f[k];
    }
  }
  const std::time_t t = static_cast<std::time_t>(now_unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::string buf(8192, '\0');
  const size_t n = c_format.empty() ? 0 : std::strftime(buf.data(), buf.size(), c_format.c_str(), &tm);
  buf.resize(n);
  return budget.make_string(std::move(buf));
}

value loop_cycle(const call_args& args, const value& loop) {
  if (args.positional.empty()) fail_render("loop.cycle() needs at least one argument");
  const value* idx = loop.kind == value_kind::dict ? find_string_key(*loop.dict, "index0") : nullptr;
  const int64_t i = idx ? idx->i : 0;
  return args.positional[static_cast<size_t>(i % static_cast<int64_t>(args.positional.size()))];
}

}  // namespace

std::vector<std::pair<std::string, value>> global_variables() {
  return {{"raise_exception", value::function(builtin_function::raise_exception)},
          {"namespace", value::function(builtin_function::namespace_ctor)},
          {"range", value::function(builtin_function::range)},
          {"dict", value::function(builtin_function::dict_ctor)},
          {"strftime_now", value::function(builtin_function::strftime_now)}};
}

value call_function(render_budget& budget, const value& fn, const call_args& args, const value& self,
                    int64_t now_unix_seconds) {
  if (fn.kind != value_kind::function) {
    if (fn.is_undefined()) fail_render("called an undefined function");
    fail_render(std::string("'") + kind_name(fn) + "' object is not callable");
  }
  switch (fn.fn) {
    case builtin_function::raise_exception: raise_exception(budget, args);
    case builtin_function::namespace_ctor: return make_namespace(budget, args);
    case builtin_function::dict_ctor: return make_dict(budget, args);
    case builtin_function::range: return make_range(budget, args);
    case builtin_function::strftime_now: return strftime_now(budget, args, now_unix_seconds);
    case builtin_function::bound_method: return call_method(budget, fn.list->items[0], *fn.s, args);
    case builtin_function::loop_cycle: return loop_cycle(args, self);
    case builtin_function::macro: break;  // the renderer runs macros (renderer.cpp, call_macro)
  }
  fail_render("unknown function");
}

}  // namespace tessera::jinja::detail
