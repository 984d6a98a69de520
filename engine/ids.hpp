// The identifiers of the serving core: requests, their sequences (one per choice), and physical KV
// blocks. Token ids are engine/base/token_id.hpp (the tokenizer shares them).
//
// Request and sequence ids are distinct types, so that passing one where the other is meant (or a
// count, or an actor layer's ticket) does not compile; 0 is "none" for both.
#pragma once
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>

namespace tessera {

// A strong typedef over uint64_t: explicit to make, .value() to read, ordered and hashable.
template <class Tag>
class id_type {
 public:
  using rep = uint64_t;
  constexpr id_type() = default;
  constexpr explicit id_type(rep v) : v_(v) {}
  constexpr rep value() const { return v_; }
  constexpr explicit operator bool() const { return v_ != 0; }
  // The id after this one (ids are handed out in order).
  constexpr id_type next() const { return id_type(v_ + 1); }
  friend constexpr bool operator==(id_type, id_type) = default;
  friend constexpr auto operator<=>(id_type, id_type) = default;
  friend std::ostream& operator<<(std::ostream& os, id_type id) { return os << id.v_; }
  // For serializers that bind to the stored value (the actor layer's CAF inspect()).
  rep& value_ref() { return v_; }

 private:
  rep v_ = 0;
};

using request_id = id_type<struct request_id_tag>;
using seq_id = id_type<struct seq_id_tag>;
// A physical block of the executor's KV pool (device or host); int32_t because executors index their
// pools with it.
using block_id = int32_t;
// A block-table entry whose block was released while the sequence lives on: with sliding-window
// attention (model_config::kv_window) the leading blocks that no layer's window reaches any more are
// freed, and their entries keep their logical position with this id. Executors never read or write
// such an entry (they skip keys outside the window); step_layout refuses one inside the window.
inline constexpr block_id no_block = -1;

}  // namespace tessera

template <class Tag>
struct std::hash<tessera::id_type<Tag>> {
  size_t operator()(tessera::id_type<Tag> id) const noexcept { return std::hash<uint64_t>{}(id.value()); }
};
