#include "region_map.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "log.hpp"

namespace strata::arenas {

std::string region_map::default_path(int pid) {
    const std::string dir = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    return dir + "/strata-regions-" + std::to_string(pid) + ".json";
}

region_map::region_map(std::string path) : path_(std::move(path)) {
    if (path_.empty()) {
        const char* env = std::getenv("STRATA_REGION_MAP");
        path_ = (env && *env) ? std::string(env) : default_path(static_cast<int>(getpid()));
    }
    std::lock_guard lock(mutex_);
    publish();
}

region_map::~region_map() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
}

void region_map::add(region r) {
    std::lock_guard lock(mutex_);
    regions_.push_back(std::move(r));
    publish();
}

void region_map::remove(std::uintptr_t address) {
    std::lock_guard lock(mutex_);
    std::erase_if(regions_, [&](const region& r) { return r.address == address; });
    publish();
}

std::vector<region> region_map::regions() const {
    std::lock_guard lock(mutex_);
    return regions_;
}

void region_map::publish() const {
    nlohmann::json doc;
    doc["pid"] = static_cast<int>(getpid());
    doc["regions"] = nlohmann::json::array();
    for (const auto& r : regions_)
        doc["regions"].push_back({{"name", r.name}, {"address", r.address}, {"bytes", r.bytes}, {"node", r.node}});
    const std::string tmp = path_ + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << doc.dump(1) << "\n";
        if (!out) {
            logger("arenas")->warn("Cannot write the region map {} ({} regions); placement-report --pid will not see them.",
                                   tmp, regions_.size());
            return;
        }
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path_, ec);
    if (ec) logger("arenas")->warn("Cannot publish the region map {}: {}.", path_, ec.message());
}

std::vector<region> region_map::read(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open the region map " + path);
    nlohmann::json doc;
    try {
        in >> doc;
    } catch (const std::exception& e) {
        throw std::runtime_error("cannot parse the region map " + path + ": " + e.what());
    }
    std::vector<region> out;
    for (const auto& r : doc.at("regions"))
        out.push_back({r.at("name").get<std::string>(), r.at("address").get<std::uintptr_t>(),
                       r.at("bytes").get<std::size_t>(), r.at("node").get<int>()});
    return out;
}

}  // namespace strata::arenas
