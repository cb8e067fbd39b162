#include "gguf/gguf_writer.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <spdlog/fmt/fmt.h>

#include "gguf/gguf_reader.hpp"

namespace strata::gguf {

namespace {

template <class T>
void put(std::ostream& out, T v) {
    out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_string(std::ostream& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

void put_value(std::ostream& out, const value& v) {
    switch (v.type()) {
        case value_type::UINT8: put<uint8_t>(out, static_cast<uint8_t>(v.as_u64())); break;
        case value_type::INT8: put<int8_t>(out, static_cast<int8_t>(v.as_i64())); break;
        case value_type::UINT16: put<uint16_t>(out, static_cast<uint16_t>(v.as_u64())); break;
        case value_type::INT16: put<int16_t>(out, static_cast<int16_t>(v.as_i64())); break;
        case value_type::UINT32: put<uint32_t>(out, static_cast<uint32_t>(v.as_u64())); break;
        case value_type::INT32: put<int32_t>(out, static_cast<int32_t>(v.as_i64())); break;
        case value_type::UINT64: put<uint64_t>(out, v.as_u64()); break;
        case value_type::INT64: put<int64_t>(out, v.as_i64()); break;
        case value_type::FLOAT32: put<float>(out, static_cast<float>(v.as_f64())); break;
        case value_type::FLOAT64: put<double>(out, v.as_f64()); break;
        case value_type::BOOL: put<uint8_t>(out, v.as_bool() ? 1 : 0); break;
        case value_type::STRING: put_string(out, v.as_string()); break;
        case value_type::ARRAY:
            put<uint32_t>(out, static_cast<uint32_t>(v.elem_type()));
            put<uint64_t>(out, v.as_array().size());
            for (const value& e : v.as_array()) put_value(out, e);
            break;
    }
}

void pad_to(std::ostream& out, uint64_t& pos, uint32_t alignment) {
    static const char zeros[256] = {};
    while (pos % alignment != 0) {
        const uint64_t n = std::min<uint64_t>(alignment - pos % alignment, sizeof zeros);
        out.write(zeros, static_cast<std::streamsize>(n));
        pos += n;
    }
}

}  // namespace

void writer::set(const std::string& key, value v) {
    for (auto& [k, existing] : kv_)
        if (k == key) {
            existing = std::move(v);
            return;
        }
    kv_.emplace_back(key, std::move(v));
}

bool writer::erase(const std::string& key) {
    return std::erase_if(kv_, [&](const auto& kv) { return kv.first == key; }) > 0;
}

bool writer::erase_tensor(const std::string& name) {
    return std::erase_if(tensors_, [&](const auto& t) { return t.name == name; }) > 0;
}

void writer::add_tensor(const std::string& name, formats::ggml_type type, std::vector<int64_t> ne, fill_fn fill) {
    if (name.empty() || name.size() > kMaxTensorName)
        throw gguf_error(fmt::format("tensor name '{}' must have 1..{} bytes", name, kMaxTensorName));
    for (const auto& t : tensors_)
        if (t.name == name) throw gguf_error(fmt::format("tensor '{}' added twice", name));
    if (ne.empty() || ne.size() > kMaxDims)
        throw gguf_error(fmt::format("tensor '{}' has {} dimensions (must be 1..{})", name, ne.size(), kMaxDims));
    int64_t n = 1;
    for (int64_t d : ne) {
        if (d <= 0) throw gguf_error(fmt::format("tensor '{}' has a dimension of {}", name, d));
        n *= d;
    }
    const formats::type_info& ti = formats::info(type);
    if (ne[0] % ti.block_size != 0)
        throw gguf_error(fmt::format("tensor '{}': rows of {} elements are not a multiple of the {} block size {}",
                                     name, ne[0], ti.name, ti.block_size));
    const uint64_t n_bytes = static_cast<uint64_t>(n / ti.block_size) * ti.type_size;
    tensors_.push_back({name, type, std::move(ne), n_bytes, std::move(fill)});
}

void writer::add_tensor(const std::string& name, formats::ggml_type type, std::vector<int64_t> ne,
                        std::vector<uint8_t> bytes) {
    const size_t n_given = bytes.size();
    add_tensor(name, type, std::move(ne), [data = std::move(bytes)](std::span<uint8_t> out) {
        std::memcpy(out.data(), data.data(), out.size());
    });
    if (tensors_.back().n_bytes != n_given) {
        const uint64_t expected = tensors_.back().n_bytes;
        tensors_.pop_back();
        throw gguf_error(fmt::format("tensor '{}' needs {} bytes, {} given", name, expected, n_given));
    }
}

void writer::set_zero_tail(const std::string& name, uint64_t bytes) {
    for (auto& t : tensors_)
        if (t.name == name) {
            if (bytes > t.n_bytes)
                throw gguf_error(fmt::format("tensor '{}' has {} bytes, fewer than a zero tail of {}", name, t.n_bytes,
                                             bytes));
            t.zero_tail = bytes;
            return;
        }
    throw gguf_error(fmt::format("no tensor '{}' to give a zero tail", name));
}

uint32_t writer::alignment() const {
    for (const auto& [k, v] : kv_)
        if (k == "general.alignment") return static_cast<uint32_t>(v.as_u64("general.alignment"));
    return kDefaultAlignment;
}

void writer::write(std::ostream& out) const { write_impl(out, false); }

uint64_t writer::write_impl(std::ostream& out, bool holes) const {
    const uint32_t align = alignment();
    if (align == 0 || (align & (align - 1)) != 0)
        throw gguf_error(fmt::format("general.alignment is {}, which is not a power of two", align));
    std::ostringstream head;
    put<uint32_t>(head, kMagic);
    put<uint32_t>(head, 3);
    put<uint64_t>(head, tensors_.size());
    put<uint64_t>(head, kv_.size());
    for (const auto& [k, v] : kv_) {
        put_string(head, k);
        put<uint32_t>(head, static_cast<uint32_t>(v.type()));
        put_value(head, v);
    }
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
        put_string(head, t.name);
        put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
        for (int64_t d : t.ne) put<uint64_t>(head, static_cast<uint64_t>(d));
        put<uint32_t>(head, static_cast<uint32_t>(t.type));
        put<uint64_t>(head, offset);
        offset += (t.n_bytes + align - 1) / align * align;
    }
    const std::string header = head.str();
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    uint64_t pos = header.size();
    pad_to(out, pos, align);

    std::vector<uint8_t> buffer;
    for (const auto& t : tensors_) {
        buffer.assign(t.n_bytes - t.zero_tail, 0);
        t.fill(buffer);
        out.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(buffer.size()));
        pos += buffer.size();
        if (holes) {
            out.seekp(static_cast<std::streamoff>(t.zero_tail), std::ios::cur);
        } else {
            const std::vector<char> zeros(std::min<uint64_t>(t.zero_tail, uint64_t{1} << 20), 0);
            for (uint64_t left = t.zero_tail; left > 0; left -= std::min<uint64_t>(left, zeros.size()))
                out.write(zeros.data(), static_cast<std::streamsize>(std::min<uint64_t>(left, zeros.size())));
        }
        pos += t.zero_tail;
        pad_to(out, pos, align);
    }
    if (!out) throw gguf_error("write failed");
    return pos;
}

void writer::write_file(const std::string& path) const {
    // A name of this process's own, so concurrent writers of one path never share a temporary file.
    static std::atomic<unsigned> counter{0};
    const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
    uint64_t size = 0;
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw gguf_error(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
        try {
            size = write_impl(out, true);
            out.flush();
            if (!out) throw gguf_error(fmt::format("{}: write failed: {}", tmp, std::strerror(errno)));
        } catch (...) {
            out.close();
            std::remove(tmp.c_str());
            throw;
        }
    }
    std::error_code ec;
    std::filesystem::resize_file(tmp, size, ec);  // a zero tail at the very end leaves the file short
    if (ec) {
        std::remove(tmp.c_str());
        throw gguf_error(fmt::format("{}: cannot size to {} bytes: {}", tmp, size, ec.message()));
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
        std::remove(tmp.c_str());
        throw gguf_error(fmt::format("{}: cannot rename from {}: {}", path, tmp, ec.message()));
    }
}

std::vector<uint8_t> writer::write_to_memory() const {
    std::ostringstream out;
    write(out);
    const std::string s = out.str();
    return {s.begin(), s.end()};
}

}  // namespace strata::gguf
