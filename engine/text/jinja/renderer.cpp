#include "engine/text/jinja/renderer.hpp"

#include <algorithm>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/text/jinja/call_args.hpp"
#include "engine/text/jinja/errors.hpp"
#include "engine/text/jinja/filters.hpp"
#include "engine/text/jinja/globals.hpp"
#include "engine/text/jinja/methods.hpp"
#include "engine/text/jinja/render_budget.hpp"
#include "engine/text/jinja/values.hpp"

namespace tessera::jinja::detail {

namespace {

enum class flow { normal, break_loop, continue_loop };

// The `loop` variable of iteration `index` over `items`.
value loop_variable(const std::vector<value>& items, size_t index) {
  const auto idx = static_cast<int64_t>(index);
  const auto length = static_cast<int64_t>(items.size());
  std::vector<std::pair<value, value>> e;
  e.reserve(11);
  auto put = [&](const char* k, value v) { e.emplace_back(value::string(k), std::move(v)); };
  put("index", value::integer(idx + 1));
  put("index0", value::integer(idx));
  put("revindex", value::integer(length - idx));
  put("revindex0", value::integer(length - idx - 1));
  put("first", value::boolean(idx == 0));
  put("last", value::boolean(idx == length - 1));
  put("length", value::integer(length));
  put("depth", value::integer(1));
  put("depth0", value::integer(0));
  put("previtem", idx > 0 ? items[index - 1] : value::undefined());
  put("nextitem", idx + 1 < length ? items[index + 1] : value::undefined());
  value loop = value::make_dict(std::move(e));
  const_cast<dict_data&>(*loop.dict).is_loop = true;
  return loop;
}

class renderer {
 public:
  renderer(const limits& bounds, int64_t now) : budget_(bounds), now_(now) {}

  std::string run(const template_node& root, const context& variables) {
    frames_.push_back(global_variables());
    for (const auto& [k, v] : variables) set_var(k, v);
    frames_.emplace_back();  // the template's own top-level assignments
    exec(root);
    return std::move(out_);
  }

 private:
  using frame = std::vector<std::pair<std::string, value>>;

  // A scope for as long as it lives.
  struct frame_guard {
    explicit frame_guard(renderer& r) : r_(r) { r_.frames_.emplace_back(); }
    ~frame_guard() { r_.frames_.pop_back(); }
    renderer& r_;
  };

  // The scopes of a macro call, for as long as it lives: the scopes open at the definition stay
  // visible, those of the caller above them are set aside, and the call gets a scope of its own.
  // (A macro called after the scope it was defined in has closed sees what is open at that depth.)
  struct macro_scope {
    macro_scope(renderer& r, size_t scope_depth) : r_(r) {
      const size_t keep = std::min(scope_depth, r_.frames_.size());
      hidden_.assign(std::make_move_iterator(r_.frames_.begin() + static_cast<std::ptrdiff_t>(keep)),
                     std::make_move_iterator(r_.frames_.end()));
      r_.frames_.resize(keep);
      r_.frames_.emplace_back();
    }
    ~macro_scope() {
      r_.frames_.pop_back();
      for (auto& f : hidden_) r_.frames_.push_back(std::move(f));
    }
    macro_scope(const macro_scope&) = delete;
    macro_scope& operator=(const macro_scope&) = delete;
    renderer& r_;
    std::vector<frame> hidden_;
  };

  // Runs `body` with its output captured: the text of a block set or a macro call.
  std::string capture(const node_list& body) {
    std::string saved = std::move(out_);
    out_.clear();
    exec_body(body);
    std::string captured = std::move(out_);
    out_ = std::move(saved);
    return captured;
  }

  void emit(std::string_view s) {
    budget_.check_size(out_.size() + s.size());
    budget_.spend(s.size() / 256);
    out_.append(s);
  }

  // ---- variables ----
  const value* find_var(const std::string& name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f)
      for (auto& [k, v] : *f)
        if (k == name) return &v;
    return nullptr;
  }
  void set_var(const std::string& name, value v) {
    for (auto& [k, old] : frames_.back()) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    frames_.back().emplace_back(name, std::move(v));
  }
  // Binds `targets` to v, unpacking v when there are several (`{% set a, b = ... %}`, `{% for k, v in ... %}`).
  void bind(const std::vector<std::string>& targets, value v, const char* what) {
    if (targets.size() == 1) {
      set_var(targets[0], std::move(v));
      return;
    }
    std::vector<value> items = iterate(budget_, v);
    if (items.size() != targets.size())
      fail_render("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) +
                  " " + what);
    for (size_t k = 0; k < items.size(); ++k) set_var(targets[k], std::move(items[k]));
  }

  // ---- statements ----
  flow exec_body(const node_list& body) {
    for (const auto& n : body) {
      flow f = exec(*n);
      if (f != flow::normal) return f;
    }
    return flow::normal;
  }

  flow exec(const template_node& n) {
    render_budget::recursion_guard guard(budget_);
    budget_.spend(1);
    switch (n.kind) {
      case node_kind::sequence: return exec_body(n.bodies[0]);
      case node_kind::text: emit(n.text); return flow::normal;
      case node_kind::output: {
        value v = eval(*n.exprs[0]);
        if (v.kind == value_kind::string)
          emit(v.str());
        else
          emit(to_str(budget_, v));
        return flow::normal;
      }
      case node_kind::if_chain:
        for (size_t k = 0; k < n.exprs.size(); ++k)
          if (truthy(eval(*n.exprs[k]))) return exec_body(n.bodies[k]);
        if (n.bodies.size() > n.exprs.size()) return exec_body(n.bodies.back());
        return flow::normal;
      case node_kind::for_loop: exec_for(n); return flow::normal;
      case node_kind::set_value: {
        value v = eval(*n.exprs[0]);
        assign(n, std::move(v));
        return flow::normal;
      }
      case node_kind::set_block: {
        std::string captured;
        {
          frame_guard scope(*this);
          captured = capture(n.bodies[0]);
        }
        set_var(n.targets[0], budget_.make_string(std::move(captured)));
        return flow::normal;
      }
      case node_kind::macro_def: {
        // Defining a macro binds its name in the current scope; its defaults are evaluated per call.
        auto m = std::make_shared<macro_data>();
        m->name = n.text;
        m->definition = &n;
        m->scope_depth = frames_.size();
        value fn = value::function(builtin_function::macro);
        fn.macro = std::move(m);
        set_var(n.text, std::move(fn));
        return flow::normal;
      }
      case node_kind::break_loop: return flow::break_loop;
      case node_kind::continue_loop: return flow::continue_loop;
    }
    return flow::normal;
  }

  void assign(const template_node& n, value v) {
    if (!n.attribute.empty()) {
      const value* target = find_var(n.targets[0]);
      if (!target || target->kind != value_kind::ns)
        fail_render("can only assign attributes of a namespace() object, not of '" + n.targets[0] + "'");
      assign_namespace_attribute(*target, n.attribute, std::move(v));
      return;
    }
    bind(n.targets, std::move(v), "variables");
  }

  void exec_for(const template_node& n) {
    std::vector<value> items = iterate(budget_, eval(*n.exprs[0]));
    if (n.exprs[1]) {
      std::vector<value> kept;
      for (auto& item : items) {
        frame_guard scope(*this);
        bind(n.targets, item, "loop variables");
        if (truthy(eval(*n.exprs[1]))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.bodies.size() > 1) exec_body(n.bodies[1]);
      return;
    }
    for (size_t idx = 0; idx < items.size(); ++idx) {
      budget_.spend(1);
      // Each iteration gets a fresh scope: assignments inside a loop body do not survive the
      // iteration (Jinja scoping; templates use namespace() to carry state across iterations).
      frame_guard scope(*this);
      if (n.uses_loop) {
        value loop = loop_variable(items, idx);
        budget_.spend(4);
        set_var("loop", std::move(loop));
      }
      bind(n.targets, items[idx], "loop variables");
      flow f = exec_body(n.bodies[0]);
      if (f == flow::break_loop) break;
    }
  }

  // ---- expressions ----
  value eval(const expr& e) {
    render_budget::recursion_guard guard(budget_);
    budget_.spend(1);
    switch (e.kind) {
      case expr_kind::literal: return e.literal;
      case expr_kind::name: {
        const value* v = find_var(e.name);
        return v ? *v : value::undefined();
      }
      case expr_kind::list:
      case expr_kind::tuple: {
        std::vector<value> items;
        items.reserve(e.kids.size());
        for (const auto& k : e.kids) items.push_back(eval(*k));
        return budget_.make_list(std::move(items), e.kind == expr_kind::tuple);
      }
      case expr_kind::dict: {
        std::vector<std::pair<value, value>> entries;
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          value key = eval(*e.kids[k]);
          if (key.kind == value_kind::list && !key.list->is_tuple) fail_render("unhashable type: 'list'");
          if (key.kind == value_kind::dict || key.kind == value_kind::ns) fail_render("unhashable type: 'dict'");
          value item = eval(*e.kids[k + 1]);
          bool replaced = false;
          for (auto& [old_key, old_item] : entries) {
            if (equals(budget_, old_key, key)) {
              old_item = item;
              replaced = true;
              break;
            }
          }
          if (!replaced) entries.emplace_back(std::move(key), std::move(item));
        }
        return budget_.make_dict(std::move(entries));
      }
      case expr_kind::getattr: return get_attribute(eval(*e.kids[0]), e.name);
      case expr_kind::getitem: {
        // Operands left to right, as Python evaluates them (so the first failing one is reported).
        value obj = eval(*e.kids[0]);
        value key = eval(*e.kids[1]);
        return get_item(budget_, obj, key);
      }
      case expr_kind::slice: return eval_slice(e);
      case expr_kind::call: return eval_call(e);
      case expr_kind::filter: {
        value subject = eval(*e.kids[0]);
        return apply_filter(budget_, e.name, subject, eval_args(e));
      }
      case expr_kind::test: {
        value subject = eval(*e.kids[0]);
        const bool r = apply_test(budget_, e.name, subject, eval_args(e));
        return value::boolean(e.negated ? !r : r);
      }
      case expr_kind::not_op: return value::boolean(!truthy(eval(*e.kids[0])));
      case expr_kind::neg:
      case expr_kind::pos: {
        value v = eval(*e.kids[0]);
        if (!is_number(v))
          fail_render(std::string("bad operand type for unary ") + (e.kind == expr_kind::neg ? "-" : "+") + ": " +
                      kind_name(v));
        if (e.kind == expr_kind::pos) return v.kind == value_kind::boolean ? value::integer(v.b) : v;
        if (v.kind == value_kind::floating) return value::floating(-v.f);
        if (as_int(v) == std::numeric_limits<int64_t>::min()) fail_render("integer overflow");
        return value::integer(-as_int(v));
      }
      case expr_kind::binary: {
        value left = eval(*e.kids[0]);
        value right = eval(*e.kids[1]);
        return binary_op(budget_, e.name, left, right);
      }
      case expr_kind::compare: {
        value left = eval(*e.kids[0]);
        for (size_t k = 0; k < e.compare_ops.size(); ++k) {
          value right = eval(*e.kids[k + 1]);
          if (!compare_op(budget_, e.compare_ops[k], left, right)) return value::boolean(false);
          left = std::move(right);
        }
        return value::boolean(true);
      }
      case expr_kind::and_op: {
        value left = eval(*e.kids[0]);
        return truthy(left) ? eval(*e.kids[1]) : left;
      }
      case expr_kind::or_op: {
        value left = eval(*e.kids[0]);
        return truthy(left) ? left : eval(*e.kids[1]);
      }
      case expr_kind::cond: {
        if (truthy(eval(*e.kids[0]))) return eval(*e.kids[1]);
        return e.kids[2] ? eval(*e.kids[2]) : value::undefined();
      }
      case expr_kind::concat: {
        std::string s;
        for (const auto& k : e.kids) {
          s += to_str(budget_, eval(*k));
          budget_.check_size(s.size());
        }
        return budget_.make_string(std::move(s));
      }
    }
    return value::undefined();
  }

  call_args eval_args(const expr& e) {
    call_args args;
    for (size_t k = 1; k < e.kids.size(); ++k) {
      value v = eval(*e.kids[k]);
      const std::string& kw = e.keywords[k - 1];
      if (kw.empty())
        args.positional.push_back(std::move(v));
      else
        args.keyword.emplace_back(kw, std::move(v));
    }
    return args;
  }

  // Bounds must be integers or none, as Jinja compiles slices to plain Python indexing.
  value eval_slice(const expr& e) {
    value obj = eval(*e.kids[0]);
    auto bound = [&](size_t k) -> std::optional<int64_t> {
      if (!e.kids[k]) return std::nullopt;
      value v = eval(*e.kids[k]);
      if (v.kind == value_kind::none) return std::nullopt;
      if (!is_integral(v)) fail_render("slice indices must be integers or None");
      return as_int(v);
    };
    slice_bounds bounds;
    bounds.start = bound(1);
    bounds.stop = bound(2);
    bounds.step = bound(3);
    return slice(budget_, obj, bounds);
  }

  value eval_call(const expr& e) {
    const expr& callee = *e.kids[0];
    if (callee.kind == expr_kind::getattr) {
      value obj = eval(*callee.kids[0]);
      if (obj.kind == value_kind::string || obj.kind == value_kind::dict || obj.kind == value_kind::list) {
        const bool loop_attr = obj.kind == value_kind::dict && obj.dict->is_loop;
        if (!loop_attr) return call_member(obj, callee.name, eval_args(e));
      }
      value fn = get_attribute(obj, callee.name);
      return call_value(fn, eval_args(e), obj);
    }
    value fn = eval(callee);
    return call_value(fn, eval_args(e), value::undefined());
  }

  // fn(args): a macro runs here (it needs the renderer), every other function in globals.*.
  value call_value(const value& fn, call_args args, const value& self) {
    if (fn.kind == value_kind::function && fn.fn == builtin_function::macro)
      return call_macro(*fn.macro, std::move(args));
    return call_function(budget_, fn, args, self, now_);
  }

  // A macro call, bound as jinja2.runtime.Macro.__call__ binds it: positional arguments first;
  // keywords then fill the parameters after them (a keyword naming a parameter already given
  // positionally is an extra keyword); a parameter left over takes its default, evaluated now in the
  // macro's scope (so it may use the parameters before it), or is undefined. Extra arguments are an
  // error unless the body uses `varargs` / `kwargs`, which then hold them. The result is the text
  // the body renders (a plain str in Jinja, autoescape being off).
  value call_macro(const macro_data& m, call_args args) {
    const template_node& def = *m.definition;
    const std::vector<std::string>& params = def.targets;
    render_budget::recursion_guard guard(budget_);
    budget_.spend(1 + params.size());
    const size_t given = std::min(args.positional.size(), params.size());
    std::vector<std::optional<value>> bound(params.size());
    for (size_t k = 0; k < given; ++k) bound[k] = std::move(args.positional[k]);
    std::vector<std::pair<std::string, value>> extra_keywords;
    for (auto& [name, v] : args.keyword) {
      const auto it = std::find(params.begin() + static_cast<std::ptrdiff_t>(given), params.end(), name);
      const auto index = static_cast<size_t>(it - params.begin());
      if (it != params.end() && !bound[index])
        bound[index] = std::move(v);
      else
        extra_keywords.emplace_back(name, std::move(v));
    }
    std::optional<value> caller;
    if (def.catches_caller && std::find(params.begin(), params.end(), "caller") == params.end()) {
      caller = value::undefined();
      for (auto it = extra_keywords.begin(); it != extra_keywords.end(); ++it) {
        if (it->first == "caller") {
          caller = std::move(it->second);
          extra_keywords.erase(it);
          break;
        }
      }
    }
    if (!def.catches_kwargs && !extra_keywords.empty())
      fail_render("macro '" + m.name + "' takes no keyword argument '" + extra_keywords[0].first + "'");
    if (!def.catches_varargs && args.positional.size() > params.size())
      fail_render("macro '" + m.name + "' takes not more than " + std::to_string(params.size()) + " argument(s)");

    macro_scope scope(*this, m.scope_depth);
    if (caller) set_var("caller", std::move(*caller));
    if (def.catches_kwargs) {
      std::vector<std::pair<value, value>> entries;
      entries.reserve(extra_keywords.size());
      for (auto& [name, v] : extra_keywords) entries.emplace_back(value::string(name), std::move(v));
      set_var("kwargs", budget_.make_dict(std::move(entries)));
    }
    if (def.catches_varargs) {
      std::vector<value> rest;
      for (size_t k = params.size(); k < args.positional.size(); ++k) rest.push_back(std::move(args.positional[k]));
      set_var("varargs", budget_.make_list(std::move(rest), true));
    }
    for (size_t k = 0; k < params.size(); ++k) {
      if (bound[k])
        set_var(params[k], std::move(*bound[k]));
      else
        set_var(params[k], def.exprs[k] ? eval(*def.exprs[k]) : value::undefined());
    }
    return budget_.make_string(capture(def.bodies[0]));
  }

  // obj.name(args) on a string, dict or list: a method, or a dict entry that holds a function.
  value call_member(const value& obj, const std::string& name, const call_args& args) {
    if (std::optional<value> result = try_call_method(budget_, obj, name, args)) return std::move(*result);
    if (obj.kind == value_kind::dict) {
      const value attr = get_attribute(obj, name);
      if (attr.kind == value_kind::function) return call_value(attr, args, obj);
    }
    fail_no_method(obj, name);
  }

  render_budget budget_;
  int64_t now_;
  std::string out_;
  std::vector<frame> frames_;
};

}  // namespace

std::string render(const template_node& root, const context& variables, const limits& bounds,
                   int64_t now_unix_seconds) {
  return renderer(bounds, now_unix_seconds).run(root, variables);
}

}  // namespace tessera::jinja::detail
