// A fresh directory for a multi-rank test: made by the master under /tmp, its name
// broadcast so that every rank knows it. The caller removes it.
#pragma once

#include <catch2/catch.hpp>

#include "tarantella/comm.hpp"
#include "tarantella/runtime.hpp"

#include <stdlib.h>

#include <string>

namespace tnt::test {

inline std::string job_dir(const std::string& prefix) {
  std::string dir;
  if (tnt::is_master_rank()) {
    std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  tnt::communicator().broadcast(dir);
  return dir;
}

}  // namespace tnt::test
