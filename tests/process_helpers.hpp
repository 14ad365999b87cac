// Processes for the tests of what a killed writer leaves behind: the pid of a process that no longer runs.
#pragma once

#include <doctest/doctest.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace ember_test {

/// The pid of a process that has exited and been reaped (so no process has it, barring reuse).
inline pid_t dead_pid() {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return pid;
}

}  // namespace ember_test
