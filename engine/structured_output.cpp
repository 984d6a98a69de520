#include "engine/structured_output.hpp"

#include <future>

#include "engine/base/error.hpp"

namespace tessera {

std::string_view to_string(structured_output_spec::kind k) {
  switch (k) {
    case structured_output_spec::kind::json_object: return "json_object";
    case structured_output_spec::kind::json_schema: return "json_schema";
    case structured_output_spec::kind::regex: return "regex";
    case structured_output_spec::kind::choice: return "choice";
    case structured_output_spec::kind::grammar: return "grammar";
    case structured_output_spec::kind::structural_tag: return "structural_tag";
  }
  return "unknown";
}

std::shared_ptr<const compiled_constraint> constraint_backend::compile(const structured_output_spec& spec) {
  auto promise = std::make_shared<std::promise<compile_result>>();
  std::future<compile_result> future = promise->get_future();
  compile_async(spec, [promise](compile_result r) { promise->set_value(std::move(r)); });
  compile_result r = future.get();
  if (!r.compiled) throw invalid_request(r.error);
  return r.compiled;
}

}  // namespace tessera
