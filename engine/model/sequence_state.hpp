// A sequence's state beside the positioned rows of its kv_cache (keys and values, latent rows), which go
// back to any position by being rewritten. A token mixer kind that keeps more declares its own part
// (mixer.hpp's mixer_kind::make_state): gated DeltaNet the recurrent state (recurrent_state.hpp), QSA
// its indexer's key stores (qsa.hpp). kv_cache's sequence operations, which the session, the
// conversation cache and speculation use, run over the parts in turn without knowing their kinds.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace strata::engine {

class state_part {
public:
    virtual ~state_part() = default;

    virtual const char* kind() const = 0;

    // The position going back to n_pos reaches (n_pos where the part is rewritten with the rows), and
    // going there.
    virtual int usable(int n_pos) const { return n_pos; }
    virtual int cut_back(int n_pos) { return n_pos; }
    // The position the part holds, or -1 where it follows the rows; the pass advances it after a batch.
    virtual int pos() const { return -1; }
    virtual void set_pos(int pos) { (void)pos; }
    // The state at position 0 (a part that follows the rows keeps them: they are rewritten).
    virtual void reset() {}
    // Keeps a copy at pos() where the part cannot cut back otherwise.
    virtual void checkpoint() {}
    virtual size_t n_checkpoints() const { return 0; }
    virtual size_t checkpoint_bytes() const { return 0; }

    // Parking (a conversation snapshot): a copy of the part as it is at pos() (with the checkpoints
    // before it), and back from such a copy at `to`, a position its usable() gave. Throws
    // std::logic_error when the copy is of another kind or holds nothing at `to`.
    virtual std::unique_ptr<state_part> park() const = 0;
    virtual void restore(const state_part& parked, int to) = 0;
    // A parked copy's bytes, and the whole-state copies among them (each state_bytes()).
    virtual size_t parked_bytes() const = 0;
    virtual size_t n_states() const { return 0; }
    virtual size_t state_bytes() const { return 0; }

    // Speculation (kv_cache::start_trace): the part after each of the next n evaluated positions is kept
    // until stop_trace(); back_to_traced(n_pos) goes to the one after position n_pos - 1 (false: none
    // kept there; true where the part follows the rows); release_trace() gives the memory back.
    virtual void start_trace(int n) { (void)n; }
    virtual void stop_trace() {}
    virtual bool back_to_traced(int n_pos) {
        (void)n_pos;
        return true;
    }
    virtual void release_trace() {}

protected:
    // Copied and moved as their own type only (park() makes a parked copy).
    state_part() = default;
    state_part(const state_part&) = default;
    state_part(state_part&&) = default;
    state_part& operator=(const state_part&) = default;
    state_part& operator=(state_part&&) = default;
};

// The parts of a sequence's state as parked beside its rows (a conversation snapshot), in the order of
// the sequence's parts.
struct parked_state {
    std::vector<std::unique_ptr<state_part>> parts;

    // The newest position at or before n it can be restored at (n when every part cuts back anywhere).
    size_t usable(size_t n) const;
    size_t bytes() const;
    size_t n_states() const;      // whole-state copies
    size_t state_bytes() const;   // of each of them (those of the first part that keeps any)
};

}  // namespace strata::engine
