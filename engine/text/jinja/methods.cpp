#include "engine/text/jinja/methods.hpp"

#include <map>
#include <string_view>
#include <vector>

#include "engine/text/jinja/errors.hpp"
#include "engine/text/jinja/python_str.hpp"
#include "engine/text/jinja/values.hpp"

namespace tessera::jinja::detail {

namespace {

// Positional-only parameter lists of the str and dict methods implemented (split also takes
// keywords); optional start/end arguments of find/startswith/... are not supported.
const std::map<std::string, std::vector<std::string>>* method_table(const value& obj) {
  static const std::map<std::string, std::vector<std::string>> string_methods = {{"strip", {"chars"}},
                                                                                 {"lstrip", {"chars"}},
                                                                                 {"rstrip", {"chars"}},
                                                                                 {"upper", {}},
                                                                                 {"lower", {}},
                                                                                 {"title", {}},
                                                                                 {"capitalize", {}},
                                                                                 {"startswith", {"prefix"}},
                                                                                 {"endswith", {"suffix"}},
                                                                                 {"split", {"sep", "maxsplit"}},
                                                                                 {"replace", {"old", "new", "count"}},
                                                                                 {"find", {"sub"}},
                                                                                 {"count", {"sub"}},
                                                                                 {"index", {"sub"}},
                                                                                 {"join", {"iterable"}},
                                                                                 {"isdigit", {}},
                                                                                 {"isspace", {}},
                                                                                 {"isalpha", {}},
                                                                                 {"isupper", {}},
                                                                                 {"islower", {}}};
  static const std::map<std::string, std::vector<std::string>> dict_methods = {
      {"items", {}}, {"keys", {}}, {"values", {}}, {"get", {"key", "default"}}};
  if (obj.kind == value_kind::string) return &string_methods;
  if (obj.kind == value_kind::dict && !obj.dict->is_loop) return &dict_methods;
  return nullptr;
}
void check_method_signature(const value& obj, const std::string& name, const call_args& args) {
  const auto* table = method_table(obj);
  if (!table) return;
  const auto it = table->find(name);
  if (it != table->end()) check_signature(name, args, it->second, name == "split");
}

value py_split(render_budget& budget, const std::string& s, const value* sep, int64_t maxsplit) {
  std::vector<value> parts;
  if (!sep || sep->kind == value_kind::none) {
    const std::u32string cps = decode_utf8(s);
    size_t k = 0;
    while (true) {
      while (k < cps.size() && is_py_space(cps[k])) ++k;
      if (k >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(value::string(encode_utf8(std::u32string_view(cps).substr(k))));  // keeps trailing space
        break;
      }
      size_t e = k;
      while (e < cps.size() && !is_py_space(cps[e])) ++e;
      parts.push_back(value::string(encode_utf8(std::u32string_view(cps).substr(k, e - k))));
      k = e;
    }
    return budget.make_list(std::move(parts));
  }
  if (sep->kind != value_kind::string) fail_render("split() separator must be a string");
  const std::string& d = sep->str();
  if (d.empty()) fail_render("empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    parts.push_back(value::string(s.substr(pos, hit - pos)));
    budget.spend(1);
    pos = hit + d.size();
  }
  parts.push_back(value::string(s.substr(pos)));
  return budget.make_list(std::move(parts));
}

bool prefix_match(const std::string& s, const value* arg, bool suffix) {
  if (!arg) fail_render(std::string(suffix ? "endswith" : "startswith") + "() takes at least 1 argument");
  auto test = [&](const value& p) {
    const std::string& x = need_string(&p, "prefix");
    if (x.size() > s.size()) return false;
    return suffix ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
  };
  if (arg->kind == value_kind::list && arg->list->is_tuple) {
    for (const auto& p : arg->list->items)
      if (test(p)) return true;
    return false;
  }
  return test(*arg);
}

std::optional<value> call_string_method(render_budget& budget, const std::string& s, const std::string& name,
                                        const call_args& args) {
  if (name == "strip") return budget.make_string(str_strip(s, args.get(0, "chars"), true, true));
  if (name == "lstrip") return budget.make_string(str_strip(s, args.get(0, "chars"), true, false));
  if (name == "rstrip") return budget.make_string(str_strip(s, args.get(0, "chars"), false, true));
  if (name == "upper") return budget.make_string(py_upper(s));
  if (name == "lower") return budget.make_string(py_lower(s));
  if (name == "title") return budget.make_string(py_title(s));
  if (name == "capitalize") return budget.make_string(py_capitalize(s));
  if (name == "startswith") return value::boolean(prefix_match(s, args.get(0, "prefix"), false));
  if (name == "endswith") return value::boolean(prefix_match(s, args.get(0, "suffix"), true));
  if (name == "split") return py_split(budget, s, args.get(0, "sep"), int_arg(args.get(1, "maxsplit"), -1));
  if (name == "replace")
    return str_replace(budget, s, need_string(args.get(0, "old"), "replace() old"),
                       need_string(args.get(1, "new"), "replace() new"), int_arg(args.get(2, "count"), -1));
  if (name == "find" || name == "count" || name == "index") {
    const std::string& sub = need_string(args.get(0, "sub"), std::string(name + "() argument").c_str());
    if (name == "count") {
      if (sub.empty()) return value::integer(static_cast<int64_t>(count_code_points(s)) + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return value::integer(n);
    }
    const size_t hit = s.find(sub);
    if (hit == std::string::npos) {
      if (name == "index") fail_render("substring not found");
      return value::integer(-1);
    }
    return value::integer(static_cast<int64_t>(count_code_points(std::string_view(s).substr(0, hit))));
  }
  if (name == "join") {
    const value* items = args.get(0, "iterable");
    if (!items) fail_render("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(budget, *items)) {
      if (item.kind != value_kind::string)
        fail_render(std::string("join() expected str instance, ") + kind_name(item) + " found");
      if (!first) out += s;
      first = false;
      out += item.str();
      budget.check_size(out.size());
    }
    return budget.make_string(std::move(out));
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isupper" || name == "islower") {
    const std::u32string cps = decode_utf8(s);
    if (cps.empty()) return value::boolean(false);
    bool any_cased = false;
    for (char32_t c : cps) {
      if (name == "isdigit" && !(c >= '0' && c <= '9')) return value::boolean(false);
      if (name == "isspace" && !is_py_space(c)) return value::boolean(false);
      if (name == "isalpha" && !is_cased(c)) return value::boolean(false);
      if (name == "isupper" && to_upper_cp(c) != c) return value::boolean(false);
      if (name == "islower" && to_lower_cp(c) != c) return value::boolean(false);
      any_cased = any_cased || is_cased(c);
    }
    return value::boolean(name == "isupper" || name == "islower" ? any_cased : true);
  }
  return std::nullopt;
}

std::optional<value> call_dict_method(render_budget& budget, const value& obj, const std::string& name,
                                      const call_args& args) {
  if (name == "items") {
    std::vector<value> pairs;
    for (const auto& [k, v] : obj.dict->entries) pairs.push_back(value::make_list({k, v}, true));
    return budget.make_list(std::move(pairs));
  }
  if (name == "keys" || name == "values") {
    std::vector<value> out;
    for (const auto& [k, v] : obj.dict->entries) out.push_back(name == "keys" ? k : v);
    return budget.make_list(std::move(out));
  }
  if (name == "get") {
    const value* key = args.get(0, "key");
    if (!key) fail_render("get() needs a key");
    const value* v = find_in_dict(budget, *obj.dict, *key);
    if (v) return *v;
    const value* fallback = args.get(1, "default");
    return fallback ? *fallback : value::none();
  }
  return std::nullopt;
}

}  // namespace

bool has_method(const value& obj, const std::string& name) {
  const auto* table = method_table(obj);
  return table && table->count(name);
}

value get_attribute(const value& obj, const std::string& name) {
  if (has_method(obj, name)) {
    value method = value::function(builtin_function::bound_method);
    method.s = std::make_shared<const std::string>(name);
    method.list = std::make_shared<const list_data>(list_data{{obj}, false, depth_of(obj) + 1, holds_namespace(obj)});
    return method;
  }
  return get_entry_attribute(obj, name);
}

std::optional<value> try_call_method(render_budget& budget, const value& obj, const std::string& name,
                                     const call_args& args) {
  if (obj.kind == value_kind::string || obj.kind == value_kind::dict) check_method_signature(obj, name, args);
  if (obj.kind == value_kind::string) {
    budget.spend(1 + obj.s->size() / 256);
    return call_string_method(budget, obj.str(), name, args);
  }
  if (obj.kind == value_kind::dict) {
    budget.spend(1 + obj.dict->entries.size());
    return call_dict_method(budget, obj, name, args);
  }
  return std::nullopt;
}

void fail_no_method(const value& obj, const std::string& name) {
  fail_render(std::string("'") + kind_name(obj) + "' object has no method '" + name + "'");
}

value call_method(render_budget& budget, const value& obj, const std::string& name, const call_args& args) {
  if (std::optional<value> result = try_call_method(budget, obj, name, args)) return std::move(*result);
  fail_no_method(obj, name);
}

std::string str_strip(const std::string& s, const value* chars, bool left, bool right) {
  const std::optional<std::u32string> set = strip_chars_arg(chars);
  return py_strip(s, set ? &*set : nullptr, left, right);
}

value str_replace(render_budget& budget, const std::string& s, const std::string& from, const std::string& to,
                  int64_t count) {
  std::string out;
  int64_t done = 0;
  if (from.empty()) {
    const std::u32string cps = decode_utf8(s);
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (k < cps.size()) append_utf8(out, cps[k]);
      budget.check_size(out.size());
    }
    return budget.make_string(std::move(out));
  }
  size_t pos = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    budget.check_size(out.size());
    pos = hit + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return budget.make_string(std::move(out));
}

}  // namespace tessera::jinja::detail
