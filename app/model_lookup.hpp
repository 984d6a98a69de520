// Where `tessera` finds its model when none is given (no MODEL, no --model): the same file wherever it
// is started from. In order:
//   1. $TESSERA_MODEL                        (a path: used as is, found or not)
//   2. ./models/<default file>               (a checkout's models/, where scripts/setup puts it)
//   3. $TESSERA_MODELS/<default file>        (a model directory of the user's choosing)
//   4. $XDG_DATA_HOME/tessera/models/<file>  (default ~/.local/share/tessera/models: the user's data dir)
//   5. <source tree>/models/<default file>   (the checkout this binary was built from: scripts/setup's)
// None there: load_error naming every place looked in.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace tessera::app {

// The places looked in, in order, for the default model file (without $TESSERA_MODEL).
std::vector<std::filesystem::path> default_model_candidates();

// The default model's path; throws load_error saying where it looked when none exists.
std::filesystem::path find_default_model();

}  // namespace tessera::app
