#include "model/kv_cache.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include <spdlog/fmt/fmt.h>

#include "formats/blocks.hpp"
#include "formats/quant.hpp"
#include "numa_policy.hpp"

namespace strata::engine {

using formats::ggml_type;

namespace {

ggml_type element_type(kv_type t) { return t == kv_type::f16 ? ggml_type::F16 : ggml_type::Q8_0; }

int chunks_for(int n_pos) { return (n_pos + kv_cache::chunk_tokens - 1) / kv_cache::chunk_tokens; }

constexpr size_t no_limit = std::numeric_limits<size_t>::max();

// The first number in a file (a cgroup's limit or usage, "max" for none), or no_limit.
size_t number_in(const std::string& path) {
    std::ifstream f(path);
    size_t n = 0;
    return f >> n ? n : no_limit;
}

// A value of a "key value" file (/proc/meminfo in KiB, a cgroup's memory.stat in bytes), or no_limit.
size_t field_of(const std::string& path, const std::string& key) {
    std::ifstream f(path);
    std::string k;
    size_t v = 0;
    while (f >> k >> v) {
        if (k == key) return v;
        f.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    return no_limit;
}

// Memory this process can still commit: the system's MemAvailable, and the room under the limit of its
// cgroup and of each cgroup above it (v2 memory.max, or v1 memory.limit_in_bytes), counting the file
// pages a cgroup holds as reclaimable.
size_t available_memory() {
    const size_t avail_kib = field_of("/proc/meminfo", "MemAvailable:");
    size_t room = avail_kib == no_limit ? no_limit : avail_kib * 1024;
    std::ifstream cg("/proc/self/cgroup");
    std::string line;
    while (std::getline(cg, line)) {
        const size_t a = line.find(':'), b = line.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        const std::string controllers = line.substr(a + 1, b - a - 1);
        const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
        if (!v2 && controllers.find("memory") == std::string::npos) continue;
        std::string dir = (v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory") + line.substr(b + 1);
        for (;;) {
            const size_t limit = number_in(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
            const size_t used = number_in(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
            if (limit != no_limit && used != no_limit) {
                const size_t file = field_of(dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file");
                const size_t in_use = used - std::min(used, file == no_limit ? 0 : file);
                room = std::min(room, limit > in_use ? limit - in_use : 0);
            }
            const size_t slash = dir.rfind('/');
            if (slash == std::string::npos || dir.size() <= (v2 ? 14u : 21u)) break;  // at the hierarchy's root
            dir.resize(slash);
        }
    }
    return room;
}

}  // namespace

kv_type parse_kv_type(const std::string& name) {
    if (name == "f16") return kv_type::f16;
    if (name == "int8") return kv_type::int8;
    throw std::invalid_argument("KV cache type '" + name + "' is not one of: f16, int8");
}

const char* kv_type_name(kv_type t) { return t == kv_type::f16 ? "f16" : "int8"; }

kv_cache::kv_cache(int n_layer, int n_ctx, int n_head_kv, int head_dim, kv_type type, bool latent)
    : n_layer_(n_layer),
      n_ctx_(n_ctx),
      n_head_kv_(n_head_kv),
      head_dim_(head_dim),
      type_(type),
      latent_(latent),
      head_row_bytes_(formats::row_size(element_type(type), head_dim)) {
    if (type == kv_type::int8 && head_dim % formats::QK8_0 != 0)
        throw std::invalid_argument("an int8 KV cache needs a head size that is a multiple of 32, this model's is " +
                                    std::to_string(head_dim));
    if (n_ctx < 1) throw std::invalid_argument(fmt::format("a KV cache needs a context of at least 1, got {}", n_ctx));
    if (latent && n_head_kv != 1)
        throw std::invalid_argument(fmt::format("a latent KV cache keeps one row per position, not {} kv heads", n_head_kv));
}

int kv_cache::capacity() const { return std::min(n_ctx_, n_chunks_ * chunk_tokens); }

size_t kv_cache::bytes() const { return static_cast<size_t>(n_layer_) * static_cast<size_t>(n_chunks_) * chunk_bytes(); }

size_t kv_cache::bytes_needed(int n_layer, int n_ctx, int n_head_kv, int head_dim, kv_type type, bool latent) {
    return static_cast<size_t>(chunks_for(n_ctx)) * chunk_tokens *
           bytes_per_token(n_layer, n_head_kv, head_dim, type, latent);
}

size_t kv_cache::bytes_per_token(int n_layer, int n_head_kv, int head_dim, kv_type type, bool latent) {
    return (latent ? 1 : 2) * static_cast<size_t>(n_layer) * static_cast<size_t>(n_head_kv) *
           formats::row_size(element_type(type), head_dim);
}

kv_cache::slab::slab(size_t n) {
    // 2 MiB-aligned, so every whole 2 MiB of the slab can be a transparent huge page. Zeros: unwritten
    // slots of a partial key block are scored, then masked, so they must stay finite.
    bytes = (n + page_bytes - 1) / page_bytes * page_bytes;
    data = reinterpret_cast<uint8_t*>(arenas::map_huge_aligned(bytes));
    std::memset(data, 0, bytes);  // commit the pages now, while growing, not in the first store
}

kv_cache::slab& kv_cache::slab::operator=(slab&& o) noexcept {
    std::swap(data, o.data);
    std::swap(bytes, o.bytes);
    return *this;
}

kv_cache::slab::~slab() { arenas::unmap_huge_aligned(reinterpret_cast<std::byte*>(data), bytes); }

void kv_cache::reserve(int n_pos) {
    if (n_pos > n_ctx_)
        throw kv_cache_full(fmt::format("the context is full: {} positions asked for, the context holds {}", n_pos,
                                        n_ctx_));
    const int want = chunks_for(n_pos);
    if (want <= n_chunks_) return;
    // Checked before committing (the slabs are zeroed at once): past a memory limit, committing would not
    // fail but get the process killed.
    const size_t more = static_cast<size_t>(want - static_cast<int>(slabs_.size())) * n_layer_ * layer_stride();
    if (const size_t room = available_memory(); more + reserve_margin > room)
        throw kv_cache_full(fmt::format("not enough memory to grow the KV cache to {} positions: {:.1f} MiB more on "
                                        "top of {:.1f} MiB, and {:.1f} MiB can be committed (of which {} MiB are "
                                        "kept free); the context holds {}",
                                        n_pos, double(more) / (1 << 20), double(bytes()) / (1 << 20),
                                        double(room) / (1 << 20), reserve_margin >> 20, n_ctx_));
    try {
        slabs_.reserve(static_cast<size_t>(chunks_for(n_ctx_)));
        while (static_cast<int>(slabs_.size()) < want) slabs_.emplace_back(static_cast<size_t>(n_layer_) * layer_stride());
    } catch (const std::bad_alloc&) {
        slabs_.resize(static_cast<size_t>(n_chunks_));
        throw kv_cache_full(fmt::format("out of memory growing the KV cache to {} positions ({:.1f} MiB more on top "
                                        "of {:.1f} MiB; the context holds {})",
                                        n_pos, double(size_t(want - n_chunks_) * n_layer_ * chunk_bytes()) / (1 << 20),
                                        double(bytes()) / (1 << 20), n_ctx_));
    }
    n_chunks_ = want;
}

void kv_cache::shrink(int n_pos) {
    const int keep = chunks_for(std::max(n_pos, 0));
    if (keep >= n_chunks_) return;
    slabs_.resize(static_cast<size_t>(keep));
    n_chunks_ = keep;
}

void kv_cache::store(int layer, int pos, const float* k, const float* v) {
    if (latent_) throw std::logic_error("kv_cache::store on a latent cache (store_latent writes its rows)");
    if (pos < 0 || pos >= capacity())
        throw kv_cache_full(fmt::format("KV cache: position {} is outside the {} positions it has room for (context {})",
                                        pos, capacity(), n_ctx_));
    const int chunk = pos / chunk_tokens, in_chunk = pos % chunk_tokens;
    const size_t slot = static_cast<size_t>(in_chunk) * head_row_bytes_;
    for (int g = 0; g < n_head_kv_; ++g) {
        put_key(tile_rows(layer, chunk, g), in_chunk, k + static_cast<size_t>(g) * head_dim_);
        put_row(v + static_cast<size_t>(g) * head_dim_, tile_rows(layer, chunk, n_head_kv_ + g) + slot);
    }
}

void kv_cache::put_row(const float* x, uint8_t* dst) const {
    if (type_ == kv_type::f16)
        kernels::cpu::to_fp16(x, reinterpret_cast<uint16_t*>(dst), head_dim_);
    else
        formats::quantize_row(element_type(type_), x, dst, head_dim_);
}

void kv_cache::store_latent(int layer, int pos, const float* row) {
    if (!latent_) throw std::logic_error("kv_cache::store_latent on a cache of keys and values");
    if (pos < 0 || pos >= capacity())
        throw kv_cache_full(fmt::format("KV cache: position {} is outside the {} positions it has room for (context {})",
                                        pos, capacity(), n_ctx_));
    uint8_t* dst = tile_rows(layer, pos / chunk_tokens, 0) + static_cast<size_t>(pos % chunk_tokens) * head_row_bytes_;
    put_row(row, dst);
}

void kv_cache::read_latent(int layer, int p0, int p1, float* out) const {
    for (int p = p0; p < p1; ++p, out += head_dim_) {
        const uint8_t* src = tile_rows(layer, p / chunk_tokens, 0) + static_cast<size_t>(p % chunk_tokens) * head_row_bytes_;
        formats::dequantize_row(element_type(type_), src, out, head_dim_);
    }
}

void kv_cache::put_key(uint8_t* tile, int r, const float* x) const {
    if (type_ == kv_type::f16) {
        constexpr int kStep = 64;  // halves converted at a time, then scattered to the blocked layout
        uint16_t h[kStep];
        for (int j0 = 0; j0 < head_dim_; j0 += kStep) {
            const int n = std::min(kStep, head_dim_ - j0);
            kernels::cpu::to_fp16(x + j0, h, n);
            for (int j = 0; j < n; ++j)
                std::memcpy(tile + kernels::cpu::attn_key_offset(ggml_type::F16, head_row_bytes_, r, j0 + j), &h[j], sizeof(h[j]));
        }
        return;
    }
    for (int j0 = 0; j0 < head_dim_; j0 += formats::QK8_0) {
        formats::block_q8_0 b;
        formats::quantize_row(ggml_type::Q8_0, x + j0, reinterpret_cast<uint8_t*>(&b), formats::QK8_0);
        put_key_block(tile, r, j0, b);
    }
}

void kv_cache::put_key_block(uint8_t* tile, int r, int j0, const formats::block_q8_0& b) const {
    for (int j = 0; j < formats::QK8_0; ++j)
        std::memcpy(tile + kernels::cpu::attn_key_offset(ggml_type::Q8_0, head_row_bytes_, r, j0 + j), &b.qs[j], 1);
    std::memcpy(tile + kernels::cpu::attn_key_scale_offset(head_dim_, head_row_bytes_, r, j0), &b.d, sizeof(b.d));
}

void kv_cache::read_rows(int layer, int chunk, int t, int r0, int r1, uint8_t* rows) const {
    const uint8_t* tile = tile_rows(layer, chunk, t);
    if (row_tile(t)) {
        std::memcpy(rows, tile + static_cast<size_t>(r0) * head_row_bytes_, static_cast<size_t>(r1 - r0) * head_row_bytes_);
        return;
    }
    for (int r = r0; r < r1; ++r, rows += head_row_bytes_) {
        if (type_ == kv_type::f16) {
            for (int j = 0; j < head_dim_; ++j)
                std::memcpy(rows + 2 * j, tile + kernels::cpu::attn_key_offset(ggml_type::F16, head_row_bytes_, r, j), 2);
            continue;
        }
        auto* blocks = reinterpret_cast<formats::block_q8_0*>(rows);
        for (int j0 = 0; j0 < head_dim_; j0 += formats::QK8_0) {
            formats::block_q8_0& b = blocks[j0 / formats::QK8_0];
            for (int j = 0; j < formats::QK8_0; ++j)
                std::memcpy(&b.qs[j], tile + kernels::cpu::attn_key_offset(ggml_type::Q8_0, head_row_bytes_, r, j0 + j), 1);
            std::memcpy(&b.d, tile + kernels::cpu::attn_key_scale_offset(head_dim_, head_row_bytes_, r, j0), sizeof(b.d));
        }
    }
}

void kv_cache::write_rows(int layer, int chunk, int t, int r0, int r1, const uint8_t* rows) {
    uint8_t* tile = tile_rows(layer, chunk, t);
    if (row_tile(t)) {
        std::memcpy(tile + static_cast<size_t>(r0) * head_row_bytes_, rows, static_cast<size_t>(r1 - r0) * head_row_bytes_);
        return;
    }
    for (int r = r0; r < r1; ++r, rows += head_row_bytes_) {
        if (type_ == kv_type::f16) {
            for (int j = 0; j < head_dim_; ++j)
                std::memcpy(tile + kernels::cpu::attn_key_offset(ggml_type::F16, head_row_bytes_, r, j), rows + 2 * j, 2);
            continue;
        }
        const auto* blocks = reinterpret_cast<const formats::block_q8_0*>(rows);
        for (int j0 = 0; j0 < head_dim_; j0 += formats::QK8_0) put_key_block(tile, r, j0, blocks[j0 / formats::QK8_0]);
    }
}

kernels::cpu::kv_tile kv_cache::tile(int layer, int g, int chunk, int n_pos) const {
    if (latent_) throw std::logic_error("kv_cache::tile on a latent cache (latent_tile lays its keys out)");
    const int64_t pos0 = int64_t{chunk} * chunk_tokens;
    return {element_type(type_),
            tile_rows(layer, chunk, g),
            tile_rows(layer, chunk, n_head_kv_ + g),
            head_row_bytes_,
            pos0,
            static_cast<int>(std::min<int64_t>(chunk_tokens, n_pos - pos0))};
}

kernels::cpu::kv_tile kv_cache::latent_tile(int layer, int chunk, int n_pos, int v_dim, void* keys) const {
    if (!latent_) throw std::logic_error("kv_cache::latent_tile on a cache of keys and values");
    const int64_t pos0 = int64_t{chunk} * chunk_tokens;
    const int n = static_cast<int>(std::min<int64_t>(chunk_tokens, n_pos - pos0));
    const uint8_t* rows = tile_rows(layer, chunk, 0);
    kernels::cpu::attn_pack_keys(element_type(type_), head_dim_, rows, head_row_bytes_, n, keys);
    kernels::cpu::kv_tile t{element_type(type_), keys, rows, head_row_bytes_, pos0, n};
    t.v_dim = v_dim;
    t.v_row_bytes = head_row_bytes_;
    return t;
}

size_t parked_state::usable(size_t n) const {
    for (const auto& p : parts) n = static_cast<size_t>(p->usable(static_cast<int>(n)));
    return n;
}

size_t parked_state::bytes() const {
    size_t n = 0;
    for (const auto& p : parts) n += p->parked_bytes();
    return n;
}

size_t parked_state::n_states() const {
    size_t n = 0;
    for (const auto& p : parts) n += p->n_states();
    return n;
}

size_t parked_state::state_bytes() const {
    for (const auto& p : parts)
        if (p->n_states() > 0) return p->state_bytes();
    return 0;
}

int kv_cache::usable(int n_pos) const {
    for (const auto& p : parts_) n_pos = p->usable(n_pos);
    return n_pos;
}

int kv_cache::cut_back(int n_pos) {
    for (const auto& p : parts_) n_pos = p->cut_back(n_pos);
    return n_pos;
}

void kv_cache::checkpoint() {
    for (const auto& p : parts_) p->checkpoint();
}

size_t kv_cache::n_checkpoints() const {
    size_t n = 0;
    for (const auto& p : parts_) n += p->n_checkpoints();
    return n;
}

size_t kv_cache::checkpoint_bytes() const {
    size_t n = 0;
    for (const auto& p : parts_) n += p->checkpoint_bytes();
    return n;
}

void kv_cache::reset_state() {
    for (const auto& p : parts_) p->reset();
}

int kv_cache::state_pos() const {
    for (const auto& p : parts_)
        if (p->pos() >= 0) return p->pos();
    return -1;
}

void kv_cache::set_state_pos(int pos) {
    for (const auto& p : parts_) p->set_pos(pos);
}

parked_state kv_cache::park_state(int n_pos) const {
    if (state_pos() >= 0 && state_pos() != n_pos)
        throw std::logic_error(fmt::format("parking {} positions with a recurrent state at {}", n_pos, state_pos()));
    parked_state p;
    for (const auto& part : parts_) p.parts.push_back(part->park());
    return p;
}

void kv_cache::restore_state(const parked_state& p, int to) {
    if (p.parts.size() != parts_.size())
        throw std::logic_error(fmt::format("a sequence state of {} parts restored from a parked one of {}",
                                           parts_.size(), p.parts.size()));
    for (size_t i = 0; i < parts_.size(); ++i) parts_[i]->restore(*p.parts[i], to);
}

void kv_cache::start_trace(int n) {
    for (const auto& p : parts_) p->start_trace(n);
}

void kv_cache::stop_trace() {
    for (const auto& p : parts_) p->stop_trace();
}

bool kv_cache::back_to_traced(int n_pos) {
    for (const auto& p : parts_)
        if (!p->back_to_traced(n_pos)) return false;
    return true;
}

void kv_cache::release_trace() {
    for (const auto& p : parts_) p->release_trace();
}

}  // namespace strata::engine
