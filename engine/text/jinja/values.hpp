// Operations on Jinja values (the type is in jinja_template.hpp), with Python's semantics: truth,
// str() and repr(), json.dumps, ==, <, `in`, iteration, len(), item access, slicing and the
// arithmetic operators. Operations that do work or build values charge the render's budget.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/text/jinja/jinja_template.hpp"
#include "engine/text/jinja/render_budget.hpp"

namespace tessera::jinja::detail {

const char* kind_name(const value& v);  // for error messages

inline bool is_number(const value& v) {
  return v.kind == value_kind::integer || v.kind == value_kind::floating || v.kind == value_kind::boolean;
}
// An int or a bool: what Python accepts as an index, a count or a range bound.
inline bool is_integral(const value& v) { return v.kind == value_kind::integer || v.kind == value_kind::boolean; }
inline double as_double(const value& v) {
  return v.kind == value_kind::floating ? v.f : static_cast<double>(v.kind == value_kind::boolean ? v.b : v.i);
}
inline int64_t as_int(const value& v) { return v.kind == value_kind::boolean ? v.b : v.i; }

size_t depth_of(const value& v);       // 0 for scalars
bool holds_namespace(const value& v);  // is or contains a namespace()

bool truthy(const value& v);

// Python's repr(float): shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16.
std::string python_float_repr(double d);
// Python str(); str() of containers uses repr() of their items.
std::string to_str(render_budget& budget, const value& v);
void append_repr(render_budget& budget, std::string& out, const value& v);

// The arguments of json.dumps that tojson passes on.
struct json_style {
  std::optional<std::string> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
void append_json(render_budget& budget, std::string& out, const value& v, const json_style& style, size_t level = 0);

bool equals(render_budget& budget, const value& a, const value& b);  // Python ==
int order(render_budget& budget, const value& a, const value& b);    // Python <, as -1/0/1; raises for unordered types
bool contains(render_budget& budget, const value& container, const value& item);  // Python `item in container`
bool compare_op(render_budget& budget, const std::string& op, const value& a, const value& b);

const value* find_in_dict(render_budget& budget, const dict_data& d, const value& key);
// The entry whose key is the string `name` (attributes of dicts, namespaces and `loop`).
const value* find_string_key(const dict_data& d, std::string_view name);

// A list iterates its items, a dict its keys, a string its code points.
std::vector<value> iterate(render_budget& budget, const value& v);
size_t length_of(const value& v);  // Python len()

// The rules for namespace() attributes, checked when one is created and when one is assigned: no
// leading '_' (the sandbox's rule for private names), and no namespace inside a namespace, which is
// what keeps values free of reference cycles.
void check_namespace_attribute(const std::string& name, const value& v);
// entries[key] = v, a new key going last.
void set_namespace_entry(std::vector<std::pair<value, value>>& entries, const value& key, value v);
// `{% set ns.name = v %}`: namespaces are the one mutable value.
void assign_namespace_attribute(const value& ns, const std::string& name, value v);

// x.name once methods are ruled out: a dict or namespace entry, loop.cycle, else undefined.
value get_entry_attribute(const value& obj, const std::string& name);
// x[key]: missing items are undefined, as in Jinja.
value get_item(render_budget& budget, const value& obj, const value& key);

struct slice_bounds {
  std::optional<int64_t> start, stop, step;  // nullopt: omitted or none
};
value slice(render_budget& budget, const value& obj, const slice_bounds& bounds);

value binary_op(render_budget& budget, const std::string& op, const value& a, const value& b);

}  // namespace tessera::jinja::detail
