#include "engine/text/jinja/values.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "engine/text/jinja/errors.hpp"
#include "engine/text/jinja/python_str.hpp"

namespace tessera::jinja {

value value::string(std::string x) {
  value v;
  v.kind = value_kind::string;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}

value value::make_list(std::vector<value> items, bool is_tuple) {
  auto data = std::make_shared<list_data>();
  for (const auto& item : items) {
    data->depth = std::max(data->depth, detail::depth_of(item) + 1);
    data->holds_namespace = data->holds_namespace || detail::holds_namespace(item);
  }
  data->items = std::move(items);
  data->is_tuple = is_tuple;
  value v;
  v.kind = value_kind::list;
  v.list = std::move(data);
  return v;
}

value value::make_dict(std::vector<std::pair<value, value>> entries) {
  auto data = std::make_shared<dict_data>();
  for (const auto& [k, item] : entries) {
    data->depth = std::max({data->depth, detail::depth_of(k) + 1, detail::depth_of(item) + 1});
    data->holds_namespace = data->holds_namespace || detail::holds_namespace(item) || detail::holds_namespace(k);
  }
  data->entries = std::move(entries);
  value v;
  v.kind = value_kind::dict;
  v.dict = std::move(data);
  return v;
}

namespace detail {

const char* kind_name(const value& v) {
  switch (v.kind) {
    case value_kind::undefined: return "undefined";
    case value_kind::none: return "none";
    case value_kind::boolean: return "bool";
    case value_kind::integer: return "int";
    case value_kind::floating: return "float";
    case value_kind::string: return "string";
    case value_kind::list: return v.list->is_tuple ? "tuple" : "list";
    case value_kind::dict: return "dict";
    case value_kind::ns: return "namespace";
    case value_kind::function: return "function";
  }
  return "value";
}

size_t depth_of(const value& v) {
  if (v.kind == value_kind::list) return v.list->depth;
  if (v.kind == value_kind::dict) return v.dict->depth;
  if (v.kind == value_kind::ns) return v.dict->depth;
  return 0;
}

bool holds_namespace(const value& v) {
  if (v.kind == value_kind::ns) return true;
  if (v.kind == value_kind::list) return v.list->holds_namespace;
  if (v.kind == value_kind::dict) return v.dict->holds_namespace;
  return false;
}

bool truthy(const value& v) {
  switch (v.kind) {
    case value_kind::undefined:
    case value_kind::none: return false;
    case value_kind::boolean: return v.b;
    case value_kind::integer: return v.i != 0;
    case value_kind::floating: return v.f != 0.0;
    case value_kind::string: return !v.s->empty();
    case value_kind::list: return !v.list->items.empty();
    case value_kind::dict: return !v.dict->entries.empty();
    case value_kind::ns:
    case value_kind::function: return true;
  }
  return false;
}

// ---- str(), repr() -------------------------------------------------------------------------------

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp10 = std::stoi(sci.substr(epos + 1));
  bool neg = false;
  if (!mant.empty() && mant[0] == '-') {
    neg = true;
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  std::string out = neg ? "-" : "";
  if (exp10 >= -4 && exp10 < 16) {
    const int point = exp10 + 1;  // digits before the decimal point
    if (point <= 0) {
      out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + ebuf;
}

std::string to_str(render_budget& budget, const value& v) {
  switch (v.kind) {
    case value_kind::undefined: return "";
    case value_kind::string: return v.str();
    default: {
      std::string out;
      append_repr(budget, out, v);
      return out;
    }
  }
}

namespace {
void append_string_repr(std::string& out, const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out.push_back(quote);
  for (char32_t c : decode_utf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\udc%02x", static_cast<unsigned>(c - 0xDC00));
      out += buf;
    } else {
      append_utf8(out, c);
    }
  }
  out.push_back(quote);
}
}  // namespace

void append_repr(render_budget& budget, std::string& out, const value& v) {
  budget.spend(1);
  budget.check_size(out.size());
  switch (v.kind) {
    case value_kind::undefined: out += "Undefined"; return;
    case value_kind::none: out += "None"; return;
    case value_kind::boolean: out += v.b ? "True" : "False"; return;
    case value_kind::integer: out += std::to_string(v.i); return;
    case value_kind::floating: out += python_float_repr(v.f); return;
    case value_kind::string:
      budget.spend(v.s->size() / 256);
      append_string_repr(out, v.str());
      return;
    case value_kind::function:
      if (v.fn == builtin_function::macro)
        out += "<Macro '" + v.macro->name + "'>";  // jinja2.runtime.Macro.__repr__
      else
        out += v.fn == builtin_function::bound_method ? "<built-in method " + *v.s + ">"
                                                      : std::string("<built-in function>");
      return;
    case value_kind::list: {
      const bool tuple = v.list->is_tuple;
      out += tuple ? "(" : "[";
      bool first = true;
      for (const auto& item : v.list->items) {
        if (!first) out += ", ";
        first = false;
        append_repr(budget, out, item);
      }
      if (tuple && v.list->items.size() == 1) out += ",";
      out += tuple ? ")" : "]";
      return;
    }
    case value_kind::dict:
    case value_kind::ns: {
      if (v.kind == value_kind::ns) out += "<Namespace ";
      out += "{";
      bool first = true;
      for (const auto& [k, item] : v.dict->entries) {
        if (!first) out += ", ";
        first = false;
        append_repr(budget, out, k);
        out += ": ";
        append_repr(budget, out, item);
      }
      out += "}";
      if (v.kind == value_kind::ns) out += ">";
      return;
    }
  }
}

// ---- json.dumps ----------------------------------------------------------------------------------

namespace {
void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : decode_utf8(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (c < 0x20) {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else if (ensure_ascii && c >= 0x80) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                          static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          append_utf8(out, c);
        }
      }
    }
  }
  out.push_back('"');
}
}  // namespace

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
void append_json(render_budget& budget, std::string& out, const value& v, const json_style& style, size_t level) {
  budget.spend(1);
  budget.check_size(out.size());
  auto newline = [&](size_t lvl) {
    if (!style.indent) return;
    out.push_back('\n');
    for (size_t k = 0; k < lvl; ++k) out += *style.indent;
  };
  switch (v.kind) {
    case value_kind::undefined: fail_render("Object of type Undefined is not JSON serializable");
    case value_kind::none: out += "null"; return;
    case value_kind::boolean: out += v.b ? "true" : "false"; return;
    case value_kind::integer: out += std::to_string(v.i); return;
    case value_kind::floating:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f < 0 ? "-Infinity" : "Infinity";
      else
        out += python_float_repr(v.f);
      return;
    case value_kind::string:
      budget.spend(v.s->size() / 256);
      append_json_string(out, v.str(), style.ensure_ascii);
      return;
    case value_kind::function:
    case value_kind::ns: fail_render(std::string("Object of type ") + kind_name(v) + " is not JSON serializable");
    case value_kind::list: {
      if (v.list->items.empty()) {
        out += "[]";
        return;
      }
      out += "[";
      bool first = true;
      for (const auto& item : v.list->items) {
        if (!first) out += style.item_separator;
        first = false;
        newline(level + 1);
        append_json(budget, out, item, style, level + 1);
      }
      newline(level);
      out += "]";
      return;
    }
    case value_kind::dict: {
      if (v.dict->entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const value*>> entries;
      for (const auto& [k, item] : v.dict->entries) {
        std::string key;
        switch (k.kind) {
          case value_kind::string: key = k.str(); break;
          case value_kind::integer: key = std::to_string(k.i); break;
          case value_kind::floating: key = python_float_repr(k.f); break;
          case value_kind::boolean: key = k.b ? "true" : "false"; break;
          case value_kind::none: key = "null"; break;
          default: fail_render(std::string("keys must be str, int, float, bool or None, not ") + kind_name(k));
        }
        entries.emplace_back(std::move(key), &item);
      }
      if (style.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      out += "{";
      bool first = true;
      for (const auto& [k, item] : entries) {
        if (!first) out += style.item_separator;
        first = false;
        newline(level + 1);
        append_json_string(out, k, style.ensure_ascii);
        out += style.key_separator;
        append_json(budget, out, *item, style, level + 1);
      }
      newline(level);
      out += "}";
      return;
    }
  }
}

// ---- comparison, membership, iteration ----------------------------------------------------------

bool equals(render_budget& budget, const value& a, const value& b) {
  budget.spend(1);
  if (is_number(a) && is_number(b)) {
    if (a.kind == value_kind::floating || b.kind == value_kind::floating) return as_double(a) == as_double(b);
    return as_int(a) == as_int(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case value_kind::undefined:
    case value_kind::none: return true;
    case value_kind::string: return a.str() == b.str();
    case value_kind::list: {
      if (a.list->is_tuple != b.list->is_tuple || a.list->items.size() != b.list->items.size()) return false;
      for (size_t k = 0; k < a.list->items.size(); ++k)
        if (!equals(budget, a.list->items[k], b.list->items[k])) return false;
      return true;
    }
    case value_kind::dict: {
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [k, item] : a.dict->entries) {
        const value* other = find_in_dict(budget, *b.dict, k);
        if (!other || !equals(budget, item, *other)) return false;
      }
      return true;
    }
    case value_kind::ns: return a.dict == b.dict;
    case value_kind::function:
      if (a.fn == builtin_function::macro) return b.fn == builtin_function::macro && a.macro == b.macro;
      return a.fn == b.fn && (a.fn != builtin_function::bound_method || (*a.s == *b.s && a.list == b.list));
    default: return false;
  }
}

const value* find_in_dict(render_budget& budget, const dict_data& d, const value& key) {
  for (const auto& [k, item] : d.entries) {
    if (equals(budget, k, key)) return &item;
  }
  return nullptr;
}

const value* find_string_key(const dict_data& d, std::string_view name) {
  for (const auto& [k, item] : d.entries)
    if (k.kind == value_kind::string && k.str() == name) return &item;
  return nullptr;
}

int order(render_budget& budget, const value& a, const value& b) {
  budget.spend(1);
  if (is_number(a) && is_number(b)) {
    if (a.kind == value_kind::floating || b.kind == value_kind::floating) {
      const double x = as_double(a), y = as_double(b);
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    return as_int(a) < as_int(b) ? -1 : (as_int(a) > as_int(b) ? 1 : 0);
  }
  if (a.kind == value_kind::string && b.kind == value_kind::string) {
    const int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.kind == value_kind::list && b.kind == value_kind::list) {
    const auto& x = a.list->items;
    const auto& y = b.list->items;
    for (size_t k = 0; k < std::min(x.size(), y.size()); ++k) {
      if (!equals(budget, x[k], y[k])) return order(budget, x[k], y[k]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail_render(std::string("'<' not supported between ") + kind_name(a) + " and " + kind_name(b));
}

bool contains(render_budget& budget, const value& container, const value& item) {
  switch (container.kind) {
    case value_kind::undefined: return false;
    case value_kind::string:
      if (item.kind != value_kind::string)
        fail_render(std::string("'in <string>' requires string as left operand, not ") + kind_name(item));
      budget.spend(1 + container.s->size() / 256);
      return container.str().find(item.str()) != std::string::npos;
    case value_kind::list:
      for (const auto& x : container.list->items)
        if (equals(budget, x, item)) return true;
      return false;
    case value_kind::dict: return find_in_dict(budget, *container.dict, item) != nullptr;
    default: fail_render(std::string("argument of type ") + kind_name(container) + " is not iterable");
  }
}

std::vector<value> iterate(render_budget& budget, const value& v) {
  switch (v.kind) {
    case value_kind::undefined: return {};
    case value_kind::list: budget.spend(v.list->items.size()); return v.list->items;
    case value_kind::dict: {
      std::vector<value> keys;
      for (const auto& e : v.dict->entries) keys.push_back(e.first);
      budget.spend(keys.size());
      return keys;
    }
    case value_kind::string: {
      std::vector<value> chars;
      for (char32_t c : decode_utf8(v.str())) {
        std::string s;
        append_utf8(s, c);
        chars.push_back(value::string(std::move(s)));
      }
      budget.spend(chars.size());
      return chars;
    }
    default: fail_render(std::string("'") + kind_name(v) + "' object is not iterable");
  }
}

size_t length_of(const value& v) {
  switch (v.kind) {
    case value_kind::undefined: return 0;
    case value_kind::string: return count_code_points(v.str());
    case value_kind::list: return v.list->items.size();
    case value_kind::dict: return v.dict->entries.size();
    default: fail_render(std::string("object of type '") + kind_name(v) + "' has no len()");
  }
}

// ---- attributes, items, slices -------------------------------------------------------------------

void check_namespace_attribute(const std::string& name, const value& v) {
  if (!name.empty() && name[0] == '_') fail_render("namespace attributes may not start with '_'");
  if (holds_namespace(v)) fail_render("a namespace() object cannot be stored inside a namespace");
}

void set_namespace_entry(std::vector<std::pair<value, value>>& entries, const value& key, value v) {
  for (auto& [k, old] : entries) {
    if (k.str() == key.str()) {
      old = std::move(v);
      return;
    }
  }
  entries.emplace_back(key, std::move(v));
}

void assign_namespace_attribute(const value& ns, const std::string& name, value v) {
  check_namespace_attribute(name, v);
  auto& data = const_cast<dict_data&>(*ns.dict);
  data.depth = std::max(data.depth, depth_of(v) + 1);
  set_namespace_entry(data.entries, value::string(name), std::move(v));
}

value get_entry_attribute(const value& obj, const std::string& name) {
  switch (obj.kind) {
    case value_kind::undefined: fail_render("cannot read attribute '" + name + "' of an undefined value");
    case value_kind::dict:
    case value_kind::ns: {
      if (const value* v = find_string_key(*obj.dict, name)) return *v;
      if (obj.kind == value_kind::dict && obj.dict->is_loop && name == "cycle")
        return value::function(builtin_function::loop_cycle);
      return value::undefined();
    }
    case value_kind::function:  // a macro's name (the one attribute of jinja2.runtime.Macro templates use)
      if (obj.fn == builtin_function::macro && name == "name") return value::string(obj.macro->name);
      return value::undefined();
    default: return value::undefined();
  }
}

namespace {
int64_t normalize_index(int64_t index, int64_t size) { return index < 0 ? index + size : index; }
}  // namespace

value get_item(render_budget& budget, const value& obj, const value& key) {
  switch (obj.kind) {
    case value_kind::undefined: fail_render("cannot index an undefined value");
    case value_kind::dict: {
      const value* v = find_in_dict(budget, *obj.dict, key);
      return v ? *v : value::undefined();
    }
    case value_kind::ns:
      if (key.kind == value_kind::string) return get_entry_attribute(obj, key.str());
      return value::undefined();
    case value_kind::list: {
      if (!is_integral(key)) return value::undefined();
      const auto size = static_cast<int64_t>(obj.list->items.size());
      const int64_t idx = normalize_index(as_int(key), size);
      if (idx < 0 || idx >= size) return value::undefined();
      return obj.list->items[static_cast<size_t>(idx)];
    }
    case value_kind::string: {
      if (!is_integral(key)) return value::undefined();
      if (is_ascii(obj.str())) {
        const auto size = static_cast<int64_t>(obj.s->size());
        const int64_t idx = normalize_index(as_int(key), size);
        if (idx < 0 || idx >= size) return value::undefined();
        return value::string(std::string(1, obj.str()[static_cast<size_t>(idx)]));
      }
      const std::u32string cps = decode_utf8(obj.str());
      budget.spend(cps.size() / 256);
      const auto size = static_cast<int64_t>(cps.size());
      const int64_t idx = normalize_index(as_int(key), size);
      if (idx < 0 || idx >= size) return value::undefined();
      std::string s;
      append_utf8(s, cps[static_cast<size_t>(idx)]);
      return value::string(std::move(s));
    }
    default: return value::undefined();
  }
}

// Python slice semantics (PySlice_AdjustIndices). Jinja compiles slices to plain Python indexing
// (they bypass environment.getitem), so slicing a non-sequence is an error rather than undefined.
value slice(render_budget& budget, const value& obj, const slice_bounds& bounds) {
  if (obj.kind == value_kind::undefined) fail_render("cannot slice an undefined value");
  if (obj.kind != value_kind::list && obj.kind != value_kind::string)
    fail_render(std::string("'") + kind_name(obj) + "' object is not subscriptable");
  const int64_t step = bounds.step.value_or(1);
  if (step == 0) fail_render("slice step cannot be zero");
  auto pick = [&](int64_t size) {
    std::vector<size_t> picked;
    int64_t start, stop;
    if (step > 0) {
      start = bounds.start ? *bounds.start : 0;
      stop = bounds.stop ? *bounds.stop : size;
      if (start < 0) start = std::max<int64_t>(start + size, 0);
      if (stop < 0) stop = std::max<int64_t>(stop + size, 0);
      start = std::min(start, size);
      stop = std::min(stop, size);
      for (int64_t k = start; k < stop; k += step) picked.push_back(static_cast<size_t>(k));
    } else {
      start = bounds.start ? *bounds.start : size - 1;
      stop = bounds.stop ? *bounds.stop : -1 - size;
      if (start < 0)
        start = std::max<int64_t>(start + size, -1);
      else
        start = std::min(start, size - 1);
      if (stop < 0)
        stop = std::max<int64_t>(stop + size, -1);
      else
        stop = std::min(stop, size - 1);
      for (int64_t k = start; k > stop; k += step) picked.push_back(static_cast<size_t>(k));
    }
    budget.spend(picked.size());
    return picked;
  };
  switch (obj.kind) {
    case value_kind::list: {
      std::vector<value> out;
      for (size_t k : pick(static_cast<int64_t>(obj.list->items.size()))) out.push_back(obj.list->items[k]);
      return budget.make_list(std::move(out), obj.list->is_tuple);
    }
    case value_kind::string: {
      const std::u32string cps = decode_utf8(obj.str());
      std::u32string out;
      for (size_t k : pick(static_cast<int64_t>(cps.size()))) out.push_back(cps[k]);
      return budget.make_string(encode_utf8(out));
    }
    default: return value::undefined();
  }
}

// ---- operators -----------------------------------------------------------------------------------

namespace {
// Python integers do not overflow; ours are 64-bit and refuse to wrap.
int64_t checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail_render("integer overflow");
  return r;
}
int64_t checked_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) fail_render("integer overflow");
  return r;
}
int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail_render("integer overflow");
  return r;
}
}  // namespace

value binary_op(render_budget& budget, const std::string& op, const value& a, const value& b) {
  if (a.is_undefined() || b.is_undefined()) fail_render("undefined value used with operator '" + op + "'");
  const bool numeric = is_number(a) && is_number(b);
  const bool as_float = numeric && (a.kind == value_kind::floating || b.kind == value_kind::floating);
  if (op == "+") {
    if (numeric) {
      if (as_float) return value::floating(as_double(a) + as_double(b));
      return value::integer(checked_add(as_int(a), as_int(b)));
    }
    if (a.kind == value_kind::string && b.kind == value_kind::string) {
      budget.check_size(a.s->size() + b.s->size());
      return budget.make_string(a.str() + b.str());
    }
    if (a.kind == value_kind::list && b.kind == value_kind::list) {
      if (a.list->is_tuple != b.list->is_tuple) fail_render("can only concatenate list to list");
      std::vector<value> items = a.list->items;
      items.insert(items.end(), b.list->items.begin(), b.list->items.end());
      return budget.make_list(std::move(items), a.list->is_tuple);
    }
  } else if (op == "-") {
    if (numeric) {
      if (as_float) return value::floating(as_double(a) - as_double(b));
      return value::integer(checked_sub(as_int(a), as_int(b)));
    }
  } else if (op == "*") {
    if (numeric) {
      if (as_float) return value::floating(as_double(a) * as_double(b));
      return value::integer(checked_mul(as_int(a), as_int(b)));
    }
    const value* seq = (a.kind == value_kind::string || a.kind == value_kind::list) ? &a : &b;
    const value* count = seq == &a ? &b : &a;
    if ((seq->kind == value_kind::string || seq->kind == value_kind::list) && is_integral(*count)) {
      // An empty sequence repeated any number of times is empty: no loop over n (n may be 2e13).
      const bool empty = seq->kind == value_kind::string ? seq->s->empty() : seq->list->items.empty();
      const int64_t n = empty ? 0 : std::max<int64_t>(as_int(*count), 0);
      if (seq->kind == value_kind::string) {
        const auto unit = seq->s->size();
        const size_t max_bytes = budget.bounds().max_output_bytes;
        if (unit != 0 && static_cast<uint64_t>(n) > max_bytes / unit) budget.check_size(max_bytes + 1);
        std::string s;
        s.reserve(unit * static_cast<size_t>(n));
        for (int64_t k = 0; k < n; ++k) s += seq->str();
        return budget.make_string(std::move(s));
      }
      const auto unit = seq->list->items.size();
      const uint64_t max_steps = budget.bounds().max_steps;
      if (unit != 0 && static_cast<uint64_t>(n) > max_steps / unit) budget.spend(max_steps + 1);
      budget.spend(unit * static_cast<uint64_t>(n));
      std::vector<value> items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->items.begin(), seq->list->items.end());
      return budget.make_list(std::move(items), seq->list->is_tuple);
    }
  } else if (op == "/") {
    if (numeric) {
      if (as_double(b) == 0.0) fail_render("division by zero");
      return value::floating(as_double(a) / as_double(b));
    }
  } else if (op == "//" || op == "%") {
    if (numeric) {
      if (as_double(b) == 0.0) fail_render(op == "%" ? "modulo by zero" : "integer division by zero");
      if (as_float) {
        // CPython's float_divmod, including the signs of zero results.
        const double x = as_double(a), y = as_double(b);
        double m = std::fmod(x, y);
        double div = (x - m) / y;
        if (m != 0.0) {
          if ((y < 0) != (m < 0)) {
            m += y;
            div -= 1.0;
          }
        } else {
          m = std::copysign(0.0, y);
        }
        double floordiv;
        if (div != 0.0) {
          floordiv = std::floor(div);
          if (div - floordiv > 0.5) floordiv += 1.0;
        } else {
          floordiv = std::copysign(0.0, x / y);
        }
        return value::floating(op == "%" ? m : floordiv);
      }
      const int64_t x = as_int(a), y = as_int(b);
      if (x == std::numeric_limits<int64_t>::min() && y == -1) fail_render("integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        m += y;
        q -= 1;
      }
      return value::integer(op == "%" ? m : q);
    }
    if (op == "%" && a.kind == value_kind::string) fail_unsupported("printf-style '%' string formatting");
  } else if (op == "**") {
    if (numeric) {
      if (as_float || as_int(b) < 0) {
        const double r = std::pow(as_double(a), as_double(b));
        if (std::isinf(r) && std::isfinite(as_double(a)) && std::isfinite(as_double(b)))
          fail_render("numerical result out of range");  // Python raises OverflowError
        return value::floating(r);
      }
      int64_t base = as_int(a), exp = as_int(b), result = 1;
      while (exp > 0) {
        budget.spend(1);
        if (exp & 1) result = checked_mul(result, base);
        exp >>= 1;
        if (exp > 0) base = checked_mul(base, base);
      }
      return value::integer(result);
    }
  }
  fail_render("unsupported operand types for " + op + ": " + kind_name(a) + " and " + kind_name(b));
}

bool compare_op(render_budget& budget, const std::string& op, const value& a, const value& b) {
  if (op == "==") return equals(budget, a, b);
  if (op == "!=") return !equals(budget, a, b);
  if (op == "in") return contains(budget, b, a);
  if (op == "not in") return !contains(budget, b, a);
  const int c = order(budget, a, b);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

}  // namespace detail
}  // namespace tessera::jinja
