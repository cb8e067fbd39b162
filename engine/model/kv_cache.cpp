#include "model/kv_cache.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
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

}  // namespace strata::engine
