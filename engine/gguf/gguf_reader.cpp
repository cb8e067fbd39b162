#include "gguf/gguf_reader.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_set>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>

namespace strata::gguf {

// Owns either a read-only mmap of the file or an in-memory image.
struct reader::mapping {
    void* addr = nullptr;
    size_t size = 0;
    int fd = -1;  // kept open for posix_fadvise in release_pages
    std::vector<uint8_t> owned;

    ~mapping() {
        if (addr) munmap(addr, size);
        if (fd >= 0) ::close(fd);
    }
};

namespace {

// Bounds-checked little-endian cursor over the file image; every failed read names what it was reading.
class cursor {
public:
    cursor(std::span<const uint8_t> bytes, const std::string& file) : bytes_(bytes), file_(file) {}

    size_t pos() const { return pos_; }
    size_t remaining() const { return bytes_.size() - pos_; }

    void need(uint64_t n, std::string_view what) const {
        if (n > remaining())
            throw gguf_error(fmt::format("{}: truncated: {} at offset {} needs {} bytes, but the file ({} bytes) "
                                         "has only {} left",
                                         file_, what, pos_, n, bytes_.size(), remaining()));
    }

    template <class T>
    T read(std::string_view what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string read_string(std::string_view what) {
        const size_t at = pos_;
        const auto len = read<uint64_t>(what);
        if (len > remaining())
            throw gguf_error(fmt::format("{}: {} at offset {} claims a string of {} bytes, but only {} bytes are "
                                         "left in the file",
                                         file_, what, at, len, remaining()));
        std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
        pos_ += len;
        return s;
    }

    const std::string& file() const { return file_; }

private:
    std::span<const uint8_t> bytes_;
    const std::string& file_;
    size_t pos_ = 0;
};

// Smallest number of bytes one value of type t can occupy (for rejecting impossible counts early).
uint64_t min_value_size(value_type t) {
    if (t == value_type::STRING) return 8;
    if (t == value_type::ARRAY) return 12;
    return scalar_size(t);
}

value_type read_value_type(cursor& c, std::string_view what) {
    const size_t at = c.pos();
    const auto t = c.read<uint32_t>(what);
    if (t >= kValueTypeCount)
        throw gguf_error(fmt::format("{}: {} at offset {} has unknown value type {} (valid: 0..{})", c.file(), what,
                                     at, t, kValueTypeCount - 1));
    return static_cast<value_type>(t);
}

value read_value(cursor& c, value_type t, const std::string& key, int depth) {
    switch (t) {
        case value_type::UINT8: return value::u8(c.read<uint8_t>(key));
        case value_type::INT8: return value::i8(c.read<int8_t>(key));
        case value_type::UINT16: return value::u16(c.read<uint16_t>(key));
        case value_type::INT16: return value::i16(c.read<int16_t>(key));
        case value_type::UINT32: return value::u32(c.read<uint32_t>(key));
        case value_type::INT32: return value::i32(c.read<int32_t>(key));
        case value_type::FLOAT32: return value::f32(c.read<float>(key));
        case value_type::UINT64: return value::u64(c.read<uint64_t>(key));
        case value_type::INT64: return value::i64(c.read<int64_t>(key));
        case value_type::FLOAT64: return value::f64(c.read<double>(key));
        case value_type::BOOL: {
            const size_t at = c.pos();
            const auto b = c.read<uint8_t>(key);
            if (b > 1)
                throw gguf_error(fmt::format("{}: metadata key '{}' at offset {} is a bool with byte value {} "
                                             "(must be 0 or 1)", c.file(), key, at, b));
            return value::boolean(b != 0);
        }
        case value_type::STRING: return value::str(c.read_string("string value of metadata key '" + key + "'"));
        case value_type::ARRAY: {
            if (depth >= kMaxArrayDepth)
                throw gguf_error(fmt::format("{}: metadata key '{}' nests arrays deeper than {} levels at offset {}",
                                             c.file(), key, kMaxArrayDepth, c.pos()));
            const value_type elem = read_value_type(c, "array element type of metadata key '" + key + "'");
            const size_t at = c.pos();
            const auto n = c.read<uint64_t>("array length of metadata key '" + key + "'");
            const uint64_t min_bytes = min_value_size(elem);
            if (n > c.remaining() / min_bytes)
                throw gguf_error(fmt::format("{}: metadata key '{}' at offset {} claims an array of {} {} values "
                                             "(at least {} bytes each), but only {} bytes are left in the file",
                                             c.file(), key, at, n, type_name(elem), min_bytes, c.remaining()));
            value::array elems;
            elems.reserve(n);
            for (uint64_t i = 0; i < n; ++i) elems.push_back(read_value(c, elem, key, depth + 1));
            return value::arr(elem, std::move(elems));
        }
    }
    throw gguf_error("unreachable value type");
}

bool mul_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

std::string tensor_info::shape_string() const {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

reader::reader(reader&&) noexcept = default;
reader& reader::operator=(reader&&) noexcept = default;
reader::~reader() = default;

reader reader::open(const std::string& path) {
    reader r;
    r.path_ = path;
    r.map_ = std::make_unique<mapping>();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw gguf_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        throw gguf_error(fmt::format("{}: cannot stat: {}", path, std::strerror(err)));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw gguf_error(fmt::format("{}: not a regular file", path));
    }
    const auto size = static_cast<size_t>(st.st_size);
    if (size > 0) {
        void* addr = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
        if (addr == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            throw gguf_error(fmt::format("{}: cannot map {} bytes: {}", path, size, std::strerror(err)));
        }
        r.map_->addr = addr;
        r.map_->size = size;
        r.bytes_ = {static_cast<const uint8_t*>(addr), size};
    }
    r.map_->fd = fd;
    r.parse();
    return r;
}

reader reader::from_bytes(std::vector<uint8_t> bytes, std::string name) {
    reader r;
    r.path_ = std::move(name);
    r.map_ = std::make_unique<mapping>();
    r.map_->owned = std::move(bytes);
    r.bytes_ = r.map_->owned;
    r.parse();
    return r;
}

void reader::parse() {
    cursor c(bytes_, path_);
    constexpr size_t kHeaderSize = 24;  // magic, version, tensor count, kv count
    if (bytes_.size() < kHeaderSize)
        throw gguf_error(fmt::format("{}: file is {} bytes, too small for a GGUF header ({} bytes)", path_,
                                     bytes_.size(), kHeaderSize));
    const auto magic = c.read<uint32_t>("magic");
    if (magic != kMagic) {
        std::string shown;
        for (int i = 0; i < 4; ++i) {
            const char ch = static_cast<char>(bytes_[i]);
            shown += (ch >= 32 && ch < 127) ? ch : '.';
        }
        throw gguf_error(fmt::format("{}: not a GGUF file: magic is 0x{:08x} ('{}'), expected 'GGUF'", path_, magic,
                                     shown));
    }
    version_ = c.read<uint32_t>("version");
    if (version_ != 2 && version_ != 3)
        throw gguf_error(fmt::format("{}: GGUF version {} is not supported (supported: 2 and 3)", path_, version_));
    const auto n_tensors = c.read<uint64_t>("tensor count");
    const auto n_kv = c.read<uint64_t>("metadata count");
    // Each metadata entry needs >= 8 (key length) + 4 (type) + 1 bytes; each tensor info >= 8 + 4 + 8 + 4 + 8.
    if (n_kv > c.remaining() / 13)
        throw gguf_error(fmt::format("{}: header claims {} metadata entries (at least 13 bytes each), but the "
                                     "file has only {} bytes after the header",
                                     path_, n_kv, c.remaining()));
    if (n_tensors > c.remaining() / 32)
        throw gguf_error(fmt::format("{}: header claims {} tensors (at least 32 bytes of info each), but the file "
                                     "has only {} bytes after the header",
                                     path_, n_tensors, c.remaining()));

    std::unordered_set<std::string> keys;
    kv_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
        const size_t at = c.pos();
        std::string key = c.read_string(fmt::format("key of metadata entry {}", i));
        if (!keys.insert(key).second)
            throw gguf_error(fmt::format("{}: metadata key '{}' at offset {} appears twice", path_, key, at));
        const value_type t = read_value_type(c, "value type of metadata key '" + key + "'");
        value v = read_value(c, t, key, 0);
        kv_.emplace_back(std::move(key), std::move(v));
    }

    if (const value* a = find("general.alignment")) {
        if (a->type() != value_type::UINT32)
            throw gguf_error(fmt::format("{}: general.alignment must be uint32, found {}", path_,
                                         type_name(a->type())));
        const uint64_t al = a->as_u64();
        if (al == 0 || (al & (al - 1)) != 0)
            throw gguf_error(fmt::format("{}: general.alignment is {}, which is not a power of two", path_, al));
        alignment_ = static_cast<uint32_t>(al);
    }

    std::unordered_set<std::string> names;
    tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
        tensor_info t;
        const size_t at = c.pos();
        t.name = c.read_string(fmt::format("name of tensor {}", i));
        if (t.name.size() > kMaxTensorName)
            throw gguf_error(fmt::format("{}: tensor {} at offset {} has a name of {} bytes (limit {})", path_, i,
                                         at, t.name.size(), kMaxTensorName));
        if (!names.insert(t.name).second)
            throw gguf_error(fmt::format("{}: tensor name '{}' at offset {} appears twice", path_, t.name, at));
        const auto n_dims = c.read<uint32_t>("dimension count of tensor '" + t.name + "'");
        if (n_dims == 0 || n_dims > kMaxDims)
            throw gguf_error(fmt::format("{}: tensor '{}' has {} dimensions (must be 1..{})", path_, t.name, n_dims,
                                         kMaxDims));
        t.n_elements = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const auto dim = c.read<uint64_t>(fmt::format("dimension {} of tensor '{}'", d, t.name));
            if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                throw gguf_error(fmt::format("{}: tensor '{}' dimension {} is {}", path_, t.name, d, dim));
            t.ne.push_back(static_cast<int64_t>(dim));
            if (mul_overflows(t.n_elements, t.ne.back(), &t.n_elements))
                throw gguf_error(fmt::format("{}: tensor '{}' shape {} overflows: the element count does not fit "
                                             "in 64 bits",
                                             path_, t.name, t.shape_string()));
        }
        const auto type_id = c.read<uint32_t>("type of tensor '" + t.name + "'");
        const formats::type_info* ti = formats::find_type(type_id);
        if (!ti)
            throw gguf_error(fmt::format("{}: tensor '{}' has unknown type id {}", path_, t.name, type_id));
        t.type = ti->type;
        if (t.ne[0] % ti->block_size != 0)
            throw gguf_error(fmt::format("{}: tensor '{}' of type {} has rows of {} elements, not a multiple of "
                                         "its block size {}",
                                         path_, t.name, ti->name, t.ne[0], ti->block_size));
        int64_t n_bytes = 0;
        if (mul_overflows(t.n_elements / ti->block_size, static_cast<int64_t>(ti->type_size), &n_bytes))
            throw gguf_error(fmt::format("{}: tensor '{}' shape {} of type {} overflows 64-bit byte sizes", path_,
                                         t.name, t.shape_string(), ti->name));
        t.n_bytes = static_cast<uint64_t>(n_bytes);
        t.offset = c.read<uint64_t>("data offset of tensor '" + t.name + "'");
        tensors_.push_back(std::move(t));
    }

    const uint64_t end_of_infos = c.pos();
    data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
    if (tensors_.empty()) return;
    if (data_offset_ > bytes_.size())
        throw gguf_error(fmt::format("{}: truncated: the data section should start at offset {}, but the file is "
                                     "{} bytes",
                                     path_, data_offset_, bytes_.size()));
    const uint64_t data_size = bytes_.size() - data_offset_;
    for (const auto& t : tensors_) {
        if (t.offset % alignment_ != 0)
            throw gguf_error(fmt::format("{}: tensor '{}' data offset {} is not a multiple of the alignment {}",
                                         path_, t.name, t.offset, alignment_));
        if (t.offset > data_size || t.n_bytes > data_size - t.offset)
            throw gguf_error(fmt::format("{}: tensor '{}' ({} bytes at data offset {}) ends at {}, beyond the data "
                                         "section of {} bytes (file truncated or offset corrupt)",
                                         path_, t.name, t.n_bytes, t.offset,
                                         t.offset > UINT64_MAX - t.n_bytes
                                             ? std::string("more than 2^64")
                                             : std::to_string(t.offset + t.n_bytes),
                                         data_size));
    }
    std::vector<const tensor_info*> by_offset;
    for (const auto& t : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        const tensor_info& a = *by_offset[i - 1];
        const tensor_info& b = *by_offset[i];
        if (a.offset + a.n_bytes > b.offset)
            throw gguf_error(fmt::format("{}: tensors '{}' (data offset {}, {} bytes) and '{}' (data offset {}) "
                                         "overlap",
                                         path_, a.name, a.offset, a.n_bytes, b.name, b.offset));
    }
}

const value* reader::find(std::string_view key) const {
    for (const auto& [k, v] : kv_)
        if (k == key) return &v;
    return nullptr;
}

const value& reader::at(std::string_view key) const {
    if (const value* v = find(key)) return *v;
    throw gguf_error(fmt::format("{}: required metadata key '{}' is missing", path_, key));
}

std::string reader::get_string(std::string_view key, std::string fallback) const {
    const value* v = find(key);
    return v ? v->as_string(key) : std::move(fallback);
}

uint64_t reader::get_u64(std::string_view key, uint64_t fallback) const {
    const value* v = find(key);
    return v ? v->as_u64(key) : fallback;
}

double reader::get_f64(std::string_view key, double fallback) const {
    const value* v = find(key);
    return v ? v->as_f64(key) : fallback;
}

const tensor_info* reader::find_tensor(std::string_view name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

std::span<const uint8_t> reader::tensor_data(const tensor_info& t) const {
    return bytes_.subspan(data_offset_ + t.offset, t.n_bytes);
}

void reader::release_pages(const tensor_info& t) const {
    if (!map_ || !map_->addr) return;
    const long page = sysconf(_SC_PAGESIZE);
    auto begin = reinterpret_cast<uintptr_t>(bytes_.data() + data_offset_ + t.offset);
    const uintptr_t end = begin + t.n_bytes;
    begin = (begin + page - 1) / page * page;  // never drop a page shared with a neighbour's first bytes
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    posix_fadvise(map_->fd, static_cast<off_t>(data_offset_ + t.offset), static_cast<off_t>(t.n_bytes),
                  POSIX_FADV_DONTNEED);
}

}  // namespace strata::gguf
