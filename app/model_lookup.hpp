// Where `tessera` finds a model: by path, by library name, or the default one when none is given.
//
// The model library is one directory of the user's: $TESSERA_MODELS, else
// $XDG_DATA_HOME/tessera/models, else ~/.local/share/tessera/models. `tessera pull NAME` fills it from
// the catalogue (app/model_catalogue.hpp), `tessera list` shows it, `tessera rm NAME` empties it.
//
// A catalogue model's file (the default model's too, when no MODEL and no --model is given) is looked
// for in these places, in order, so that it is the same file wherever `tessera` is started from:
//   1. ./models/<file>                       (a checkout's models/, where scripts/setup puts it)
//   2. $TESSERA_MODELS/<file>                (a model directory of the user's choosing)
//   3. $XDG_DATA_HOME/tessera/models/<file>  (default ~/.local/share/tessera/models: the user's data dir)
//   4. <source tree>/models/<file>           (the checkout this binary was built from: scripts/setup's)
// For the default model $TESSERA_MODEL (a path: used as is, found or not) comes before all of them.
// None there: load_error naming every place looked in.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace tessera::app {

// The library directory (not created here); throws invalid_request when neither TESSERA_MODELS,
// XDG_DATA_HOME nor HOME is set.
std::filesystem::path model_library_dir();

// The places looked in, in order, for a catalogue model's file `file`.
std::vector<std::filesystem::path> model_file_candidates(const std::string& file);

// The places looked in, in order, for the default model file (without $TESSERA_MODEL).
std::vector<std::filesystem::path> default_model_candidates();

// The default model's path; throws load_error saying where it looked when none exists.
std::filesystem::path find_default_model();

struct resolved_model {
  std::filesystem::path path;
  std::string name;  // the catalogue name (or alias) it was given by; "" for a path
};

// MODEL as `serve`, `generate --model`, `inspect` and `--draft-model` take it, in this order:
//   ""                 the default model (find_default_model)
//   hf:ORG/REPO        refused (invalid_request): the Hugging Face Hub is not reachable from here
//   an existing path   a .gguf file or a Hugging Face model directory, as is
//   a catalogue name   its file in the places above (load_error "run `tessera pull NAME`" when absent)
//   a library entry    <library>/MODEL: a .gguf file or a model directory put there by hand
//   a path-like text   (holds a '/' or ends in .gguf) as is: the loader says the path does not exist
// Anything else is an unknown name: invalid_request listing the catalogue's names.
resolved_model resolve_model(const std::string& spec);

}  // namespace tessera::app
