// Runs a piece of a test in a forked child with a deadline, for tests whose failure mode is a hang
// (a loader blocking forever on a FIFO) or a huge allocation (gigabytes for one hostile token id):
// run in-process, such a regression would stall or kill the whole suite instead of failing one test.
// The child reports through a pipe; the parent kills it at the deadline and reports that.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <string>

namespace tessera::test {

struct child_result {
  bool timed_out = false;
  bool ok = false;      // the child ran `body` to the end and it returned ""
  std::string message;  // what the child reported (or how it died)
};

// Forks, runs `body` in the child and waits up to `deadline`. `body` returns "" on success or a
// description of what went wrong; an exception escaping it is reported with its what(). Nothing the
// child does (gtest assertions included) reaches the parent except through that string, so bodies
// must not use EXPECT_*.
inline child_result run_in_child(const std::function<std::string()>& body, std::chrono::milliseconds deadline) {
  child_result result;
  int fds[2];
  if (::pipe(fds) != 0) {
    result.message = "pipe() failed";
    return result;
  }
  std::fflush(nullptr);  // no buffered output duplicated into the child
  const pid_t pid = ::fork();
  if (pid < 0) {
    result.message = "fork() failed";
    return result;
  }
  if (pid == 0) {
    ::close(fds[0]);
    std::string msg;
    try {
      msg = body();
    } catch (const std::exception& e) { msg = std::string("exception: ") + e.what(); } catch (...) {
      msg = "unknown exception";
    }
    if (msg.size() > 4000) msg.resize(4000);  // stays within the pipe's buffer
    const char status = msg.empty() ? 'k' : 'f';
    [[maybe_unused]] ssize_t n = ::write(fds[1], &status, 1);
    n = ::write(fds[1], msg.data(), msg.size());
    ::close(fds[1]);
    ::_exit(0);  // no atexit handlers, no gtest teardown in the child
  }
  ::close(fds[1]);
  std::string reported;
  const auto stop = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(stop - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;  // the child closed its end: it is done
    reported.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (result.timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (result.timed_out) {
    result.message = "still running after " + std::to_string(deadline.count()) + " ms; killed";
  } else if (WIFSIGNALED(status)) {
    result.message = "killed by signal " + std::to_string(WTERMSIG(status)) + " (out of memory?)";
  } else if (reported.empty()) {
    result.message = "exited without reporting (status " + std::to_string(WEXITSTATUS(status)) + ")";
  } else {
    result.ok = reported[0] == 'k';
    result.message = reported.substr(1);
  }
  return result;
}

// Peak resident memory of this process in KiB (VmHWM). reset_peak_rss() sets it back to the current
// RSS (Linux >= 4.0), so that a forked child measures only its own growth and not the parent's peak.
inline int64_t peak_rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

inline bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace tessera::test
