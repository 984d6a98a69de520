#include "engine/text/jinja/filters.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "engine/text/jinja/errors.hpp"
#include "engine/text/jinja/methods.hpp"
#include "engine/text/jinja/python_str.hpp"
#include "engine/text/jinja/values.hpp"

namespace tessera::jinja::detail {

namespace {

// Parameters after the subject, as Jinja's filter functions declare them.
struct filter_signature {
  std::vector<std::string> parameters;
  bool variadic = false;  // takes arbitrary arguments (map, select, ...), checked where they are used
};

// Every filter this interpreter has.
const filter_signature* find_filter(const std::string& name) {
  static const std::map<std::string, filter_signature> table = {
      {"trim", {{"chars"}}},
      {"length", {}},
      {"count", {}},
      {"upper", {}},
      {"lower", {}},
      {"capitalize", {}},
      {"title", {}},
      {"string", {}},
      {"safe", {}},
      {"list", {}},
      {"abs", {}},
      {"items", {}},
      {"reverse", {}},
      {"escape", {}},
      {"e", {}},
      {"first", {}},
      {"last", {}},
      {"tojson", {{"ensure_ascii", "indent", "separators", "sort_keys"}}},
      {"default", {{"default_value", "boolean"}}},
      {"d", {{"default_value", "boolean"}}},
      {"join", {{"d", "attribute"}}},
      {"replace", {{"old", "new", "count"}}},
      {"int", {{"default", "base"}}},
      {"float", {{"default"}}},
      {"unique", {{"case_sensitive", "attribute"}}},
      {"sort", {{"reverse", "case_sensitive", "attribute"}}},
      {"sum", {{"attribute", "start"}}},
      {"min", {{"case_sensitive", "attribute"}}},
      {"max", {{"case_sensitive", "attribute"}}},
      {"indent", {{"width", "first", "blank"}}},
      {"map", {{}, true}},
      {"select", {{}, true}},
      {"reject", {{}, true}},
      {"selectattr", {{}, true}},
      {"rejectattr", {{}, true}}};
  const auto it = table.find(name);
  return it == table.end() ? nullptr : &it->second;
}

// Jinja's tests take the subject plus at most one positional argument (operator.* functions).
enum class test_arity { subject_only, one_argument };

// Every test this interpreter has.
const test_arity* find_test(const std::string& name) {
  constexpr test_arity subject = test_arity::subject_only, one = test_arity::one_argument;
  static const std::map<std::string, test_arity> table = {{"defined", subject},
                                                          {"undefined", subject},
                                                          {"none", subject},
                                                          {"string", subject},
                                                          {"number", subject},
                                                          {"integer", subject},
                                                          {"float", subject},
                                                          {"boolean", subject},
                                                          {"true", subject},
                                                          {"false", subject},
                                                          {"mapping", subject},
                                                          {"sequence", subject},
                                                          {"iterable", subject},
                                                          {"callable", subject},
                                                          {"lower", subject},
                                                          {"upper", subject},
                                                          {"even", subject},
                                                          {"odd", subject},
                                                          {"divisibleby", one},
                                                          {"eq", one},
                                                          {"equalto", one},
                                                          {"==", one},
                                                          {"ne", one},
                                                          {"!=", one},
                                                          {"lt", one},
                                                          {"lessthan", one},
                                                          {"<", one},
                                                          {"le", one},
                                                          {"<=", one},
                                                          {"gt", one},
                                                          {"greaterthan", one},
                                                          {">", one},
                                                          {"ge", one},
                                                          {">=", one},
                                                          {"in", one},
                                                          {"sameas", one}};
  const auto it = table.find(name);
  return it == table.end() ? nullptr : &it->second;
}

// Jinja's title filter: words start after '-', whitespace, '(', '{', '[' or '<'.
std::string jinja_title(const std::string& s) {
  std::u32string cps = decode_utf8(s);
  bool word_start = true;
  for (auto& c : cps) {
    const bool sep = c == '-' || is_py_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      word_start = true;
      continue;
    }
    c = word_start ? to_upper_cp(c) : to_lower_cp(c);
    word_start = false;
  }
  return encode_utf8(cps);
}

// Jinja's ignore_case(): strings compare lower-cased unless case_sensitive is set.
value sort_key(render_budget& budget, const value& v, bool case_sensitive) {
  if (case_sensitive || v.kind != value_kind::string) return v;
  return budget.make_string(py_lower(v.str()));
}

value get_item_or_attr(render_budget& budget, const value& item, const value& attribute) {
  // Jinja's attribute="a.b" walks dotted paths; integer parts index lists.
  if (attribute.kind != value_kind::string) return get_item(budget, item, attribute);
  value cur = item;
  const std::string& path = attribute.str();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur.is_undefined()) return cur;
    int64_t idx = 0;
    auto r = std::from_chars(part.data(), part.data() + part.size(), idx);
    if (!part.empty() && r.ec == std::errc() && r.ptr == part.data() + part.size() && cur.kind == value_kind::list)
      cur = get_item(budget, cur, value::integer(idx));
    else if (cur.kind == value_kind::dict || cur.kind == value_kind::ns)
      cur = get_item(budget, cur, value::string(part));
    else
      cur = value::undefined();
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// The item itself, or its `attribute=` (a path, as Jinja's make_attrgetter reads it).
value attribute_of(render_budget& budget, const value& item, const value* attribute) {
  return attribute ? get_item_or_attr(budget, item, *attribute) : item;
}

// Removes '_' between digits (Python numeric literal syntax); nullopt when one is misplaced.
std::optional<std::string> drop_digit_underscores(const std::string& t) {
  std::string out;
  for (size_t k = 0; k < t.size(); ++k) {
    if (t[k] != '_') {
      out.push_back(t[k]);
      continue;
    }
    if (k == 0 || k + 1 == t.size() || !std::isxdigit(static_cast<unsigned char>(t[k - 1])) ||
        !std::isxdigit(static_cast<unsigned char>(t[k + 1])))
      return std::nullopt;
  }
  return out;
}

// Python int(s, base) for bases 0 and 2..36, limited to 64 bits.
std::optional<int64_t> parse_py_int(const std::string& s, int64_t base) {
  if (base != 0 && (base < 2 || base > 36)) return std::nullopt;
  const auto cleaned = drop_digit_underscores(py_strip(s, nullptr, true, true));
  if (!cleaned) return std::nullopt;
  std::string t = *cleaned;
  bool negative = false;
  if (!t.empty() && (t[0] == '+' || t[0] == '-')) {
    negative = t[0] == '-';
    t.erase(0, 1);
  }
  const int detected = radix_prefix(t);
  if (base == 0) {
    base = detected ? detected : 10;
    if (detected)
      t.erase(0, 2);
    else if (t.size() > 1 && t[0] == '0' && t.find_first_not_of('0') != std::string::npos)
      return std::nullopt;
  } else if (detected == base) {
    t.erase(0, 2);
  }
  if (t.empty()) return std::nullopt;
  uint64_t magnitude = 0;
  auto r = std::from_chars(t.data(), t.data() + t.size(), magnitude, static_cast<int>(base));
  const uint64_t max_magnitude = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + (negative ? 1 : 0);
  const bool too_big = r.ec == std::errc::result_out_of_range || (r.ec == std::errc() && magnitude > max_magnitude);
  if (too_big && r.ptr == t.data() + t.size())
    fail_render("integer overflow (integers are 64-bit here, Python's are unbounded)");
  if (r.ec != std::errc() || r.ptr != t.data() + t.size()) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
}

// Python float(s): decimal digits with optional fraction and exponent, or inf/infinity/nan.
std::optional<double> parse_py_float(const std::string& s) {
  const auto cleaned = drop_digit_underscores(py_strip(s, nullptr, true, true));
  if (!cleaned || cleaned->empty()) return std::nullopt;
  const std::string& t = *cleaned;
  size_t k = (t[0] == '+' || t[0] == '-') ? 1 : 0;
  std::string word;
  for (size_t m = k; m < t.size(); ++m)
    word.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(t[m]))));
  if (word == "inf" || word == "infinity") return t[0] == '-' ? -HUGE_VAL : HUGE_VAL;
  if (word == "nan") return std::numeric_limits<double>::quiet_NaN();
  size_t digits = 0;
  while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) {
    ++k;
    ++digits;
  }
  if (k < t.size() && t[k] == '.') {
    ++k;
    while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) {
      ++k;
      ++digits;
    }
  }
  if (digits == 0) return std::nullopt;
  if (k < t.size() && (t[k] == 'e' || t[k] == 'E')) {
    ++k;
    if (k < t.size() && (t[k] == '+' || t[k] == '-')) ++k;
    size_t exp_digits = 0;
    while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) {
      ++k;
      ++exp_digits;
    }
    if (exp_digits == 0) return std::nullopt;
  }
  if (k != t.size()) return std::nullopt;
  return std::strtod(t.c_str(), nullptr);
}

value to_int(const value& v, const call_args& args) {
  const value* fallback = args.get(0, "default");
  const int64_t base = int_arg(args.get(1, "base"), 10);
  const value def = fallback ? *fallback : value::integer(0);
  if (v.kind == value_kind::integer) return v;
  if (v.kind == value_kind::boolean) return value::integer(v.b);
  if (v.kind == value_kind::floating) {
    if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return def;
    return value::integer(static_cast<int64_t>(v.f));
  }
  if (v.kind == value_kind::string) {
    // Jinja: int(s, base), else int(float(s)), else the default.
    if (const auto i = parse_py_int(v.str(), base)) return value::integer(*i);
    if (const auto d = parse_py_float(v.str()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
      return value::integer(static_cast<int64_t>(*d));
  }
  return def;
}

}  // namespace

bool is_known_filter(const std::string& name) { return find_filter(name) != nullptr; }

bool is_standard_jinja_filter(const std::string& name) {
  static const char* const names[] = {"attr",        "batch",     "center",    "dictsort", "filesizeformat",
                                      "forceescape", "format",    "groupby",   "pprint",   "random",
                                      "round",       "slice",     "striptags", "truncate", "urlencode",
                                      "urlize",      "wordcount", "wordwrap",  "xmlattr"};
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

bool is_known_test(const std::string& name) { return find_test(name) != nullptr; }

bool is_standard_jinja_test(const std::string& name) { return name == "escaped" || name == "filter" || name == "test"; }

value apply_filter(render_budget& budget, const std::string& name, const value& v, const call_args& args) {
  budget.spend(1);
  if (const filter_signature* sig = find_filter(name); sig && !sig->variadic)
    check_signature(name, args, sig->parameters, true);
  if (name == "trim") return budget.make_string(str_strip(to_str(budget, v), args.get(0, "chars"), true, true));
  if (name == "length" || name == "count") return value::integer(static_cast<int64_t>(length_of(v)));
  if (name == "upper") return budget.make_string(py_upper(to_str(budget, v)));
  if (name == "lower") return budget.make_string(py_lower(to_str(budget, v)));
  if (name == "capitalize") return budget.make_string(py_capitalize(to_str(budget, v)));
  if (name == "title") return budget.make_string(jinja_title(to_str(budget, v)));
  if (name == "string") return v.kind == value_kind::string ? v : budget.make_string(to_str(budget, v));
  if (name == "safe") return v;
  if (name == "tojson") {
    json_style style;
    if (const value* ascii = args.get(0, "ensure_ascii")) style.ensure_ascii = truthy(*ascii);
    if (const value* indent = args.get(1, "indent"); indent && indent->kind != value_kind::none) {
      if (indent->kind == value_kind::string)
        style.indent = indent->str();
      else
        style.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(int_arg(indent, 0), 0, 64)), ' ');
      style.item_separator = ",";
    }
    if (const value* sep = args.get(2, "separators"); sep && sep->kind != value_kind::none) {
      if (sep->kind != value_kind::list || sep->list->items.size() != 2)
        fail_render("tojson separators must be a pair of strings");
      style.item_separator = need_string(&sep->list->items[0], "separator");
      style.key_separator = need_string(&sep->list->items[1], "separator");
    }
    if (const value* sort = args.get(3, "sort_keys")) style.sort_keys = truthy(*sort);
    std::string out;
    append_json(budget, out, v, style);
    return budget.make_string(std::move(out));
  }
  if (name == "default" || name == "d") {
    const value* fallback = args.get(0, "default_value");
    const value* boolean = args.get(1, "boolean");
    const bool use_fallback = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
    if (use_fallback) return fallback ? *fallback : value::string("");
    return v;
  }
  if (name == "join") {
    const value* sep = args.get(0, "d");
    const value* attribute = args.get(1, "attribute");
    const std::string d = sep ? to_str(budget, *sep) : std::string();
    std::string out;
    bool first = true;
    for (const auto& item : iterate(budget, v)) {
      if (!first) out += d;
      first = false;
      out += to_str(budget, attribute_of(budget, item, attribute));
      budget.check_size(out.size());
    }
    return budget.make_string(std::move(out));
  }
  if (name == "replace") {
    return str_replace(budget, to_str(budget, v), to_str(budget, need(args.get(0, "old"), "replace old")),
                       to_str(budget, need(args.get(1, "new"), "replace new")), int_arg(args.get(2, "count"), -1));
  }
  if (name == "first" || name == "last") {
    std::vector<value> items = iterate(budget, v);
    if (items.empty()) return value::undefined();
    return name == "first" ? items.front() : items.back();
  }
  if ((name == "int" || name == "float" || name == "indent") && v.is_undefined())
    fail_render("'" + name + "' filter applied to an undefined value");
  if (name == "int") return to_int(v, args);
  if (name == "float") {
    const value* fallback = args.get(0, "default");
    if (is_number(v)) return value::floating(as_double(v));
    if (v.kind == value_kind::string) {
      if (const auto d = parse_py_float(v.str())) return value::floating(*d);
    }
    return fallback ? *fallback : value::floating(0.0);
  }
  if (name == "list") return budget.make_list(iterate(budget, v));
  if (name == "abs") {
    if (v.kind == value_kind::floating) return value::floating(std::fabs(v.f));
    if (!is_number(v)) fail_render(std::string("bad operand type for abs(): ") + kind_name(v));
    if (as_int(v) == std::numeric_limits<int64_t>::min()) fail_render("integer overflow");
    return value::integer(std::llabs(as_int(v)));
  }
  if (name == "items") {
    if (v.is_undefined()) return budget.make_list({});
    if (v.kind != value_kind::dict) fail_render("items filter needs a mapping");
    return call_method(budget, v, "items", {});
  }
  if (name == "reverse") {
    if (v.kind == value_kind::string) {
      std::u32string cps = decode_utf8(v.str());
      std::reverse(cps.begin(), cps.end());
      return budget.make_string(encode_utf8(cps));
    }
    std::vector<value> items = iterate(budget, v);
    std::reverse(items.begin(), items.end());
    return budget.make_list(std::move(items));
  }
  if (name == "unique") {
    const bool case_sensitive = flag_arg(args, 0, "case_sensitive");
    const value* attribute = args.get(1, "attribute");
    std::vector<value> out, keys;
    for (const auto& item : iterate(budget, v)) {
      const value key = sort_key(budget, attribute_of(budget, item, attribute), case_sensitive);
      bool seen = false;
      for (const auto& o : keys)
        if (equals(budget, o, key)) {
          seen = true;
          break;
        }
      if (!seen) {
        out.push_back(item);
        keys.push_back(key);
      }
    }
    return budget.make_list(std::move(out));
  }
  if (name == "sort") {
    const bool reverse = flag_arg(args, 0, "reverse");
    const bool case_sensitive = flag_arg(args, 1, "case_sensitive");
    const value* attribute = args.get(2, "attribute");
    std::vector<std::pair<value, value>> keyed;
    for (const auto& item : iterate(budget, v))
      keyed.emplace_back(sort_key(budget, attribute_of(budget, item, attribute), case_sensitive), item);
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      return reverse ? order(budget, b.first, a.first) < 0 : order(budget, a.first, b.first) < 0;
    });
    std::vector<value> out;
    for (auto& [k, item] : keyed) out.push_back(std::move(item));
    return budget.make_list(std::move(out));
  }
  if (name == "sum") {
    const value* attribute = args.get(0, "attribute");
    value total = args.get(1, "start") ? *args.get(1, "start") : value::integer(0);
    for (const auto& item : iterate(budget, v))
      total = binary_op(budget, "+", total, attribute_of(budget, item, attribute));
    return total;
  }
  if (name == "min" || name == "max") {
    const bool case_sensitive = flag_arg(args, 0, "case_sensitive");
    const value* attribute = args.get(1, "attribute");
    std::vector<value> items = iterate(budget, v);
    if (items.empty()) return value::undefined();
    auto key = [&](const value& item) {
      return sort_key(budget, attribute_of(budget, item, attribute), case_sensitive);
    };
    value best = items[0];
    value best_key = key(best);
    for (size_t k = 1; k < items.size(); ++k) {
      const value item_key = key(items[k]);
      const int c = order(budget, item_key, best_key);
      if (name == "min" ? c < 0 : c > 0) {
        best = items[k];
        best_key = item_key;
      }
    }
    return best;
  }
  // Jinja's map/select/... yield nothing for a falsy input (`if value:`), even a non-iterable one.
  if ((name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") &&
      !truthy(v))
    return budget.make_list({});
  if (name == "map") {
    std::vector<value> out;
    const value* attribute = nullptr;
    for (const auto& [k, a] : args.keyword)
      if (k == "attribute") attribute = &a;
    if (attribute) {
      const value* fallback = nullptr;
      for (const auto& [k, a] : args.keyword)
        if (k == "default") fallback = &a;
      for (const auto& item : iterate(budget, v)) {
        value x = get_item_or_attr(budget, item, *attribute);
        out.push_back(x.is_undefined() && fallback ? *fallback : x);
      }
      return budget.make_list(std::move(out));
    }
    if (args.positional.empty()) fail_render("map() needs a filter name or attribute=");
    const std::string filter_name = need_string(&args.positional[0], "map() filter name");
    call_args rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const auto& item : iterate(budget, v)) out.push_back(apply_filter(budget, filter_name, item, rest));
    return budget.make_list(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_when = name == "select" || name == "selectattr";
    size_t first_arg = 0;
    const value* attribute = nullptr;
    if (by_attr) {
      if (args.positional.empty()) fail_render(name + "() needs an attribute name");
      attribute = &args.positional[0];
      first_arg = 1;
    }
    std::string test_name;
    call_args test_args;
    if (args.positional.size() > first_arg) {
      test_name = need_string(&args.positional[first_arg], "test name");
      test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(first_arg) + 1,
                                  args.positional.end());
    }
    std::vector<value> out;
    for (const auto& item : iterate(budget, v)) {
      const value subject = attribute_of(budget, item, attribute);
      const bool ok = test_name.empty() ? truthy(subject) : apply_test(budget, test_name, subject, test_args);
      if (ok == keep_when) out.push_back(item);
    }
    return budget.make_list(std::move(out));
  }
  if (name == "indent") {
    // Jinja's do_indent: lines = (s + "\n").splitlines(); indent all but the first (and blank
    // lines only when blank=True), rejoined with "\n".
    const value* width_arg = args.get(0, "width");
    const bool first = flag_arg(args, 1, "first");
    const bool blank = flag_arg(args, 2, "blank");
    const std::string pad =
        width_arg && width_arg->kind == value_kind::string
            ? width_arg->str()
            : std::string(static_cast<size_t>(std::clamp<int64_t>(int_arg(width_arg, 4), 0, 256)), ' ');
    const std::vector<std::string> lines = py_splitlines(to_str(budget, v) + "\n");
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k > 0) {
        out += '\n';
        if (blank || !lines[k].empty()) out += pad;
      }
      out += lines[k];
      budget.check_size(out.size());
    }
    if (first) out = pad + out;
    return budget.make_string(std::move(out));
  }
  if (name == "escape" || name == "e") {
    std::string out;
    for (char c : to_str(budget, v)) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out.push_back(c);
      }
    }
    return budget.make_string(std::move(out));
  }
  if (is_standard_jinja_filter(name)) fail_unsupported("the filter '" + name + "'");
  fail_render("no filter named '" + name + "'");
}

bool apply_test(render_budget& budget, const std::string& name, const value& v, const call_args& args) {
  budget.spend(1);
  if (const test_arity* arity = find_test(name)) {
    static const std::vector<std::string> one = {"value"}, none;
    check_signature("test " + name, args, *arity == test_arity::one_argument ? one : none, false);
  }
  const value* arg = args.get(0, "value");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == value_kind::none;
  if (name == "string") return v.kind == value_kind::string;
  if (name == "number") return is_number(v);
  if (name == "integer") return v.kind == value_kind::integer;
  if (name == "float") return v.kind == value_kind::floating;
  if (name == "boolean") return v.kind == value_kind::boolean;
  if (name == "true") return v.kind == value_kind::boolean && v.b;
  if (name == "false") return v.kind == value_kind::boolean && !v.b;
  if (name == "mapping") return v.kind == value_kind::dict;
  if (name == "sequence")  // len() and __getitem__: Undefined has both (jinja2/tests.py, test_sequence)
    return v.kind == value_kind::string || v.kind == value_kind::list || v.kind == value_kind::dict || v.is_undefined();
  if (name == "iterable")
    return v.kind == value_kind::string || v.kind == value_kind::list || v.kind == value_kind::dict || v.is_undefined();
  if (name == "callable") return v.kind == value_kind::function || v.is_undefined();  // Undefined has __call__
  if (name == "lower" || name == "upper") {
    // str(value).islower() / isupper(): at least one cased character and none of the other case.
    bool any_cased = false;
    for (char32_t c : decode_utf8(to_str(budget, v))) {
      if (name == "lower" ? to_lower_cp(c) != c : to_upper_cp(c) != c) return false;
      any_cased = any_cased || is_cased(c);
    }
    return any_cased;
  }
  if (name == "even" || name == "odd") {
    if (!is_integral(v)) fail_render("even/odd test needs an integer");
    const bool even = as_int(v) % 2 == 0;
    return name == "even" ? even : !even;
  }
  if (name == "divisibleby") {
    const value& d = need(arg, "divisibleby");
    if (!is_number(v) || !is_number(d)) fail_render("divisibleby needs numbers");
    const value rem = binary_op(budget, "%", v, d);
    return rem.kind == value_kind::floating ? rem.f == 0.0 : rem.i == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(budget, v, need(arg, name.c_str()));
  if (name == "ne" || name == "!=") return !equals(budget, v, need(arg, name.c_str()));
  if (name == "lt" || name == "lessthan" || name == "<") return order(budget, v, need(arg, name.c_str())) < 0;
  if (name == "le" || name == "<=") return order(budget, v, need(arg, name.c_str())) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return order(budget, v, need(arg, name.c_str())) > 0;
  if (name == "ge" || name == ">=") return order(budget, v, need(arg, name.c_str())) >= 0;
  if (name == "in") return contains(budget, need(arg, "in"), v);
  if (name == "sameas") {
    const value& o = need(arg, "sameas");
    if (v.kind != o.kind) return false;
    if (v.kind == value_kind::none || v.kind == value_kind::undefined) return true;
    if (v.kind == value_kind::boolean) return v.b == o.b;
    if (v.kind == value_kind::ns || v.kind == value_kind::dict) return v.dict == o.dict;
    if (v.kind == value_kind::list) return v.list == o.list;
    return equals(budget, v, o);
  }
  if (is_standard_jinja_test(name)) fail_unsupported("the test '" + name + "'");
  fail_render("no test named '" + name + "'");
}

}  // namespace tessera::jinja::detail
