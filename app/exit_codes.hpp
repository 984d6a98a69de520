// The exit statuses of every `tessera` command, one meaning each, as CLI conventions go (0 success,
// 1 failure, 2 usage), plus the two a supervisor (systemd, a container runtime, a script) must tell
// apart to act: a model that cannot be loaded (fix the path or the file; retrying will not help) and
// a port that cannot be bound (wait for it, or pick another). docs/server.md lists them.
#pragma once

namespace tessera::app {

enum exit_code : int {
  exit_ok = 0,
  exit_failure = 1,        // a runtime failure after startup, or anything not listed below
  exit_usage = 2,          // a bad flag, option value, config file or environment value
  exit_rejected = 3,       // `generate --input`: some requests were rejected (the others ran)
  exit_model_load = 4,     // the model (its file, weights or tokenizer) cannot be found or loaded
  exit_cannot_listen = 5,  // `serve`: the address/port cannot be bound (in use, not this host's, privileged)
};

}  // namespace tessera::app
