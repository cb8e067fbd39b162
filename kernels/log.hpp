// One spdlog logger per component ("kernels", "engine", "arenas", "server", ...).
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace strata {

// Returns the component's logger, creating it (stderr, shared format) on first use. Thread-safe.
std::shared_ptr<spdlog::logger> logger(const std::string& component);

}  // namespace strata
