// What this process holds resident, from /proc/self/smaps: anonymous memory (heap, stacks, the copied
// weights, KV caches), the pages of one mapped file (the model), and the pages of every other mapped file
// (the program and its shared libraries).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace strata::engine {

struct process_memory {
    uint64_t rss = 0;         // every resident page (the sum of the three below)
    uint64_t anonymous = 0;   // anonymous pages, including private copies of file pages
    uint64_t file = 0;        // file-backed pages of mappings of `file_path`
    uint64_t program = 0;     // file-backed pages of every other file
};

// Reads `smaps` (default: this process's). file_path names the file counted apart (compared by device
// and inode, so any path to it works); empty: none. nullopt when smaps cannot be read.
std::optional<process_memory> read_process_memory(const std::string& file_path,
                                                  const std::string& smaps = "/proc/self/smaps");

}  // namespace strata::engine
