// Per-layer key/value cache for one sequence, in f16 or int8 (Q8_0 blocks along the head dimension),
// grown in chunks of kv_cache::chunk_tokens positions as the sequence fills, up to n_ctx.
//
// Chunk c (positions [c * chunk_tokens, (c + 1) * chunk_tokens)) of every layer is one mapping, 2 MiB
// aligned and advised for transparent huge pages (decode reads the whole cache every token; with 4 KiB
// pages that is a TLB miss every page), each layer's part starting on a page:
//   K: [n_head_kv][chunk_tokens][head_row]    head_row: head_dim halves, or head_dim / 32 Q8_0 blocks
//   V: [n_head_kv][chunk_tokens][head_row]
// so the keys (and the values) of one kv head in one chunk are one attention tile. Keys are stored in
// the tile's blocked, transposed layout (kernels/cpu/attention.hpp): the same bytes, another order.
//
// A latent cache (deepseek2's multi-head latent attention) keeps one row per position instead: the
// normed latent and the rotated key, head_dim = kv_lora_rank + n_rot values, n_head_kv = 1, in plain
// row order (f16 halves or Q8_0 blocks), one tile per chunk: [chunk_tokens][head_row].
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "cpu/attention.hpp"
#include "formats/blocks.hpp"
#include "model/sequence_state.hpp"

namespace strata::engine {

enum class kv_type { f16, int8 };

kv_type parse_kv_type(const std::string& name);  // "f16" | "int8"; throws listing both
const char* kv_type_name(kv_type t);

// The cache cannot hold a position: past its context, or out of memory while growing. The message
// names the numbers; what the cache held stays intact.
struct kv_cache_full : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class kv_cache {
public:
    static constexpr int chunk_tokens = kernels::cpu::attn_tile_max;

    kv_cache(int n_layer, int n_ctx, int n_head_kv, int head_dim, kv_type type, bool latent = false);

    int n_ctx() const { return n_ctx_; }
    int n_layer() const { return n_layer_; }
    kv_type type() const { return type_; }
    int n_chunks() const { return n_chunks_; }
    int n_head_kv() const { return n_head_kv_; }
    bool latent() const { return latent_; }
    int n_tiles() const { return latent_ ? 1 : 2 * n_head_kv_; }  // per chunk and layer
    size_t head_row_bytes() const { return head_row_bytes_; }
    int capacity() const;                       // positions with memory (a whole number of chunks, <= n_ctx)
    size_t bytes() const;                       // allocated now
    size_t max_bytes() const { return bytes_needed(n_layer_, n_ctx_, n_head_kv_, head_dim_, type_, latent_); }
    size_t chunk_bytes() const { return static_cast<size_t>(n_tiles()) * tile_bytes(); }
    // Bytes of a cache holding n_ctx positions (whole chunks).
    static size_t bytes_needed(int n_layer, int n_ctx, int n_head_kv, int head_dim, kv_type type, bool latent = false);
    // Bytes one position takes over every layer (keys and values), as attention reads them.
    static size_t bytes_per_token(int n_layer, int n_head_kv, int head_dim, kv_type type, bool latent = false);

    // Makes room for positions [0, n_pos). Throws kv_cache_full past n_ctx, or when the memory it would
    // commit, plus reserve_margin, is more than the system or this process's cgroup can still give.
    void reserve(int n_pos);
    static constexpr size_t reserve_margin = size_t(64) << 20;
    // Frees the chunks past those that hold positions [0, n_pos).
    void shrink(int n_pos);

    // Writes position pos (< capacity()) of a layer: k, v: [n_head_kv * head_dim] f32.
    void store(int layer, int pos, const float* k, const float* v);
    // Latent cache: writes position pos's row (head_dim f32), and reads positions [p0, p1) of a layer
    // back as f32 rows: out [p1 - p0][head_dim].
    void store_latent(int layer, int pos, const float* row);
    void read_latent(int layer, int p0, int p1, float* out) const;

    // Positions [chunk * chunk_tokens, min(n_pos, (chunk + 1) * chunk_tokens)) of kv head g.
    kernels::cpu::kv_tile tile(int layer, int g, int chunk, int n_pos) const;
    // Latent cache: the same positions as a tile whose keys are the rows laid out in `keys` (scratch of
    // chunk_tokens * head_row_bytes() bytes, written here by attn_pack_keys) and whose values are the
    // first v_dim elements of the rows themselves, read in place.
    kernels::cpu::kv_tile latent_tile(int layer, int chunk, int n_pos, int v_dim, void* keys) const;

    // Positions [r0, r1) of tile t of a chunk (t in [0, n_tiles()): the keys of kv head t, then the
    // values of kv head t - n_head_kv; a latent cache's one tile) copied out to / in from rows: [r1 - r0][head_row_bytes()],
    // whatever the tile's own layout. For parking and restoring conversations.
    void read_rows(int layer, int chunk, int t, int r0, int r1, uint8_t* rows) const;
    void write_rows(int layer, int chunk, int t, int r0, int r1, const uint8_t* rows);

    // The sequence's state as the session, the conversation cache and speculation see it, whatever mixer
    // kinds the model has: the positioned rows (keys and values, latent rows) go back to any position by
    // being rewritten, and each part beside them (sequence_state.hpp) says how it goes back.
    // The position that going back to n_pos reaches (n_pos, or the newest checkpoint at or before it).
    int usable(int n_pos) const;
    // Goes back to usable(n_pos) and returns it.
    int cut_back(int n_pos);
    // Keeps a copy of the state at its position where a part cannot cut back (nothing for the others).
    void checkpoint();
    size_t n_checkpoints() const;
    size_t checkpoint_bytes() const;
    // The state at position 0 (the rows are rewritten as positions are evaluated again).
    void reset_state();
    // The position the parts beside the rows are at, or -1 where they follow the rows; the forward pass
    // moves it on after each batch.
    int state_pos() const;
    void set_state_pos(int pos);
    // The state beside the rows for parking the first n_pos positions (state_pos() must be n_pos or -1),
    // and back: the state at `to` (a position p.usable() gave) with p's checkpoints before it.
    // Throws std::logic_error when they do not match.
    parked_state park_state(int n_pos) const;
    void restore_state(const parked_state& p, int to);
    // Speculation: the state after each of the next n evaluated positions but the last is kept (where
    // a rejected draft goes back to) until stop_trace(); back_to_traced(n_pos) goes back to the one
    // after position n_pos - 1 without evaluating (false: none kept there; true where the state
    // follows the rows); release_trace() gives the copies' memory back.
    void start_trace(int n);
    void stop_trace();
    bool back_to_traced(int n_pos);
    void release_trace();

    // The parts beside the rows, one per mixer kind that keeps one (make_sequence_state adds them).
    void add_state(std::unique_ptr<state_part> part) { parts_.push_back(std::move(part)); }
    const std::vector<std::unique_ptr<state_part>>& states() const { return parts_; }
    // The part of type T (a mixer kind's own), or nullptr when the model's layers keep none.
    template <class T>
    T* find_state() const {
        for (const auto& p : parts_)
            if (auto* t = dynamic_cast<T*>(p.get())) return t;
        return nullptr;
    }
    // The same, for that kind's code; throws std::logic_error when absent.
    template <class T>
    T& state() const {
        if (T* t = find_state<T>()) return *t;
        throw std::logic_error(std::string("the sequence's state has no ") + typeid(T).name());
    }

private:
    // The first byte of tile t of a chunk (read_rows's numbering).
    uint8_t* tile_rows(int layer, int chunk, int t) {
        return slabs_[static_cast<size_t>(chunk)].data + static_cast<size_t>(layer) * layer_stride() +
               static_cast<size_t>(t) * tile_bytes();
    }
    const uint8_t* tile_rows(int layer, int chunk, int t) const {
        return slabs_[static_cast<size_t>(chunk)].data + static_cast<size_t>(layer) * layer_stride() +
               static_cast<size_t>(t) * tile_bytes();
    }
    // Writes x (head_dim floats) at dst as a value (or latent) row: f16 halves or Q8_0 blocks.
    void put_row(const float* x, uint8_t* dst) const;
    // Writes key row x (head_dim floats) at row r of a key tile, in the blocked layout of
    // kernels/cpu/attention.hpp; put_key_block one Q8_0 block of it (elements j0 .. j0 + 31).
    void put_key(uint8_t* tile, int r, const float* x) const;
    void put_key_block(uint8_t* tile, int r, int j0, const formats::block_q8_0& b) const;

    size_t tile_bytes() const { return static_cast<size_t>(chunk_tokens) * head_row_bytes_; }

    // Each layer's part of a chunk starts on a page: an f16 tile row (a cache-line multiple) never
    // straddles two lines, and every page of a tile holds whole rows.
    static constexpr size_t page_bytes = 4096;
    size_t layer_stride() const { return (chunk_bytes() + page_bytes - 1) / page_bytes * page_bytes; }
    // One chunk of every layer: an anonymous mapping of n_layer * layer_stride() bytes, zeroed.
    struct slab {
        uint8_t* data = nullptr;
        size_t bytes = 0;
        slab() = default;
        explicit slab(size_t n);  // throws std::bad_alloc
        slab(slab&& o) noexcept : data(o.data), bytes(o.bytes) { o.data = nullptr; }
        slab& operator=(slab&& o) noexcept;
        ~slab();
    };

    int n_layer_, n_ctx_, n_head_kv_, head_dim_;
    kv_type type_;
    bool latent_;
    bool row_tile(int t) const { return latent_ || t >= n_head_kv_; }  // plain rows, not the blocked key layout
    size_t head_row_bytes_;   // one position of one kv head
    int n_chunks_ = 0;
    std::vector<slab> slabs_;  // [n_chunks]
    std::vector<std::unique_ptr<state_part>> parts_;
};

}  // namespace strata::engine
