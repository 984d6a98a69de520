// Methods of strings and dicts (`s.strip()`, `d.items()`, ...) and Jinja's getattr, which finds a
// method before an entry of the same name.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "engine/text/jinja/call_args.hpp"
#include "engine/text/jinja/render_budget.hpp"

namespace tessera::jinja::detail {

bool has_method(const value& obj, const std::string& name);

// x.name: the bound method when x has one (so `d.items` is the method even when the dict has an
// "items" key), else the entry (values.hpp, get_entry_attribute).
value get_attribute(const value& obj, const std::string& name);

// obj.name(args), or nullopt when obj has no such method.
std::optional<value> try_call_method(render_budget& budget, const value& obj, const std::string& name,
                                     const call_args& args);
[[noreturn]] void fail_no_method(const value& obj, const std::string& name);
value call_method(render_budget& budget, const value& obj, const std::string& name, const call_args& args);

// The string operations the trim and replace filters share with the str methods.
std::string str_strip(const std::string& s, const value* chars, bool left, bool right);
value str_replace(render_budget& budget, const std::string& s, const std::string& from, const std::string& to,
                  int64_t count);

}  // namespace tessera::jinja::detail
