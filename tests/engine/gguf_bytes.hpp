// Builds GGUF images byte by byte, so tests can write any field wrong on purpose.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace strata::testing {

class gguf_bytes {
public:
    std::vector<uint8_t> bytes;

    template <class T>
    gguf_bytes& put(T v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        bytes.insert(bytes.end(), p, p + sizeof(T));
        return *this;
    }
    gguf_bytes& str(const std::string& s) {
        put<uint64_t>(s.size());
        bytes.insert(bytes.end(), s.begin(), s.end());
        return *this;
    }
    gguf_bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3, uint32_t magic = 0x46554747) {
        return put<uint32_t>(magic).put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
    }
    gguf_bytes& kv_u32(const std::string& key, uint32_t v) { return str(key).put<uint32_t>(4).put<uint32_t>(v); }
    gguf_bytes& kv_str(const std::string& key, const std::string& v) { return str(key).put<uint32_t>(8).str(v); }
    // One tensor info: name, dims, type id, offset.
    gguf_bytes& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
        str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
        for (uint64_t d : ne) put<uint64_t>(d);
        return put<uint32_t>(type).put<uint64_t>(offset);
    }
    gguf_bytes& align(size_t a = 32) {
        while (bytes.size() % a) bytes.push_back(0);
        return *this;
    }
    gguf_bytes& zeros(size_t n) {
        bytes.insert(bytes.end(), n, 0);
        return *this;
    }
};

}  // namespace strata::testing
