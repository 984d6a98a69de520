// Running a helper program (`python3 -m pip`, python3's zipfile) as a child and waiting for it: no
// shell (arguments go to the program as they are), its stdout sent to our stderr so that a command's
// stdout holds only its result, and Ctrl-C noticed rather than fatal, so that the caller can remove
// what it had half-written before it exits.
#pragma once
#include <string>
#include <vector>

namespace tessera::app {

// Runs argv (argv[0] looked up on PATH) and waits; its exit status, or 128 + the signal that ended it.
// Throws std::runtime_error when it cannot be started (e.g. no such program).
int run_child(const std::vector<std::string>& argv);

// While one exists, SIGINT and SIGTERM set interrupted() instead of ending the process (children get
// them too, being in our process group, and end by them).
class interrupt_guard {
 public:
  interrupt_guard();
  ~interrupt_guard();
  interrupt_guard(const interrupt_guard&) = delete;
  interrupt_guard& operator=(const interrupt_guard&) = delete;
};
bool interrupted();

}  // namespace tessera::app
