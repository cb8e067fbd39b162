// GGUF v2/v3 reader: maps the file, validates every count, length, offset and shape against the
// file's size, and exposes metadata, tensor infos and tensor bytes without copying.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/types.hpp"
#include "gguf/gguf_value.hpp"

namespace strata::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian uint32
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr uint32_t kMaxDims = 4;
inline constexpr size_t kMaxTensorName = 63;   // ggml's limit (64 bytes with the terminator)
inline constexpr int kMaxArrayDepth = 8;

struct tensor_info {
    std::string name;
    std::vector<int64_t> ne;      // ggml order: ne[0] is the row length (contiguous)
    formats::ggml_type type;
    uint64_t offset;              // from the start of the data section
    uint64_t n_bytes;
    int64_t n_elements;

    int64_t n_rows() const { return ne.empty() ? 0 : n_elements / ne[0]; }
    std::string shape_string() const;  // "[2048, 768, 64]"
};

class reader {
public:
    // Maps and validates the file; throws gguf_error naming the file, field and numbers.
    static reader open(const std::string& path);
    // Validates an in-memory image (tests, tools); `name` stands for the path in messages.
    static reader from_bytes(std::vector<uint8_t> bytes, std::string name = "<memory>");

    reader(reader&&) noexcept;
    reader& operator=(reader&&) noexcept;
    ~reader();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t file_size() const { return bytes_.size(); }
    uint32_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }

    const std::vector<std::pair<std::string, value>>& metadata() const { return kv_; }
    const value* find(std::string_view key) const;      // nullptr when absent
    const value& at(std::string_view key) const;        // throws naming the key when absent
    std::string get_string(std::string_view key, std::string fallback) const;
    uint64_t get_u64(std::string_view key, uint64_t fallback) const;
    double get_f64(std::string_view key, double fallback) const;

    const std::vector<tensor_info>& tensors() const { return tensors_; }
    const tensor_info* find_tensor(std::string_view name) const;
    std::span<const uint8_t> tensor_data(const tensor_info& t) const;

    // Advises the kernel that a tensor's pages will not be read again (drops them from the page cache
    // where the file is mapped read-only). Harmless no-op for in-memory images.
    void release_pages(const tensor_info& t) const;

private:
    struct mapping;
    reader() = default;
    void parse();

    std::string path_;
    std::unique_ptr<mapping> map_;
    std::span<const uint8_t> bytes_;
    uint32_t version_ = 0;
    uint32_t alignment_ = kDefaultAlignment;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, value>> kv_;
    std::vector<tensor_info> tensors_;
};

}  // namespace strata::gguf
