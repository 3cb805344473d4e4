// What a piece of code writes to stderr (the log's warnings go there), for tests that check
// a warning: stderr goes to a temporary file while `f` runs, then comes back.
#pragma once

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace tnt::test {

template <typename F>
std::string captured_stderr(F&& f) {
  std::fflush(stderr);
  char tmpl[] = "/tmp/tnt_test_stderr_XXXXXX";
  const int fd = ::mkstemp(tmpl);
  REQUIRE(fd >= 0);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(fd, STDERR_FILENO);
  f();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fd);
  std::ifstream in(tmpl);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(tmpl);
  return text;
}

}  // namespace tnt::test
