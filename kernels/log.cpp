#include "log.hpp"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace strata {

std::shared_ptr<spdlog::logger> logger(const std::string& component) {
    static std::mutex mutex;
    std::lock_guard lock(mutex);
    if (auto existing = spdlog::get(component)) return existing;
    auto created = spdlog::stderr_color_mt(component);
    created->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
    if (const char* level = std::getenv("STRATA_LOG_LEVEL"))
        created->set_level(spdlog::level::from_str(level));
    return created;
}

}  // namespace strata
