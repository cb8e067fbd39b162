#include "process_memory.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace strata::engine {
namespace {

// "Rss:   1234 kB" -> bytes; false when the line is not `key`.
bool field_bytes(const std::string& line, const char* key, uint64_t& out) {
    if (line.rfind(key, 0) != 0) return false;
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str() + std::char_traits<char>::length(key), " %llu kB", &kb) != 1) return false;
    out = uint64_t{kb} * 1024;
    return true;
}

struct mapping {
    bool of_file = false;      // device:inode is `file_path`'s
    bool file_backed = false;  // a path on a device (inode != 0)
    uint64_t rss = 0, anonymous = 0;
};

void add(process_memory& m, const mapping& cur) {
    m.rss += cur.rss;
    const uint64_t anon = std::min(cur.anonymous, cur.rss);
    m.anonymous += anon;
    const uint64_t paged = cur.rss - anon;  // shared or clean file pages (also shmem of anonymous maps)
    if (cur.of_file)
        m.file += paged;
    else if (cur.file_backed)
        m.program += paged;
    else
        m.anonymous += paged;
}

}  // namespace

std::optional<process_memory> read_process_memory(const std::string& file_path, const std::string& smaps) {
    std::ifstream in(smaps);
    if (!in) return std::nullopt;
    struct stat st {};
    const bool have_file = !file_path.empty() && ::stat(file_path.c_str(), &st) == 0;
    // By device and inode, or by path where a layered file system shows smaps another device.
    std::string real_path;
    if (have_file) {
        char buf[PATH_MAX];
        if (::realpath(file_path.c_str(), buf) != nullptr) real_path = buf;
    }

    process_memory m;
    mapping cur;
    bool open = false;
    std::string line;
    while (std::getline(in, line)) {
        uint64_t v = 0;
        if (field_bytes(line, "Rss:", v)) {
            cur.rss = v;
        } else if (field_bytes(line, "Anonymous:", v)) {
            cur.anonymous = v;
        } else if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') != std::string::npos &&
                   line.find(':') > line.find(' ')) {
            // A mapping's header: "start-end perms offset major:minor inode [path]".
            if (open) add(m, cur);
            cur = {};
            open = true;
            std::istringstream h(line);
            std::string range, perms, offset, dev;
            unsigned long long inode = 0;
            h >> range >> perms >> offset >> dev >> inode;
            std::string path;
            std::getline(h >> std::ws, path);
            unsigned major = 0, minor = 0;
            std::sscanf(dev.c_str(), "%x:%x", &major, &minor);
            cur.file_backed = inode != 0;
            cur.of_file = have_file && ((inode == st.st_ino && makedev(major, minor) == st.st_dev) ||
                                        (!real_path.empty() && path == real_path));
        }
    }
    if (open) add(m, cur);
    return m;
}

}  // namespace strata::engine
