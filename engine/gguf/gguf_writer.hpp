// GGUF v3 writer: metadata in insertion order, tensors aligned to general.alignment. Tensor bytes
// come from a buffer or from a callback that fills them at write time (so multi-GB models are
// generated without holding them in memory).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "formats/types.hpp"
#include "gguf/gguf_value.hpp"

namespace strata::gguf {

class writer {
public:
    using fill_fn = std::function<void(std::span<uint8_t> out)>;

    // Sets or replaces a metadata key (keeps its first position).
    void set(const std::string& key, value v);
    // Removes a metadata key; false when it was not there.
    bool erase(const std::string& key);
    // Removes a tensor; false when it was not there.
    bool erase_tensor(const std::string& name);

    // Shapes are in ggml order (ne[0] = row length). Throws gguf_error on a duplicate name, a shape that
    // does not fit the type's blocks, or (for the buffer form) a byte count that does not match.
    void add_tensor(const std::string& name, formats::ggml_type type, std::vector<int64_t> ne, fill_fn fill);
    void add_tensor(const std::string& name, formats::ggml_type type, std::vector<int64_t> ne,
                    std::vector<uint8_t> bytes);

    size_t tensor_count() const { return tensors_.size(); }
    // The last `bytes` of a tensor's data are zeros: its fill callback gets only the bytes before them,
    // and write_file leaves them as a hole in the file (sparse where the file system allows).
    void set_zero_tail(const std::string& name, uint64_t bytes);

    // Writes PATH.tmp and renames it over PATH, so a failed write never leaves a partial file at PATH.
    void write_file(const std::string& path) const;
    void write(std::ostream& out) const;
    std::vector<uint8_t> write_to_memory() const;

private:
    struct pending_tensor {
        std::string name;
        formats::ggml_type type;
        std::vector<int64_t> ne;
        uint64_t n_bytes;
        fill_fn fill;
        uint64_t zero_tail = 0;
    };
    uint32_t alignment() const;
    // Writes the file's bytes (holes: seek over zero tails); returns its size.
    uint64_t write_impl(std::ostream& out, bool holes) const;

    std::vector<std::pair<std::string, value>> kv_;
    std::vector<pending_tensor> tensors_;
};

}  // namespace strata::gguf
