// How many prompt tokens a step may carry while other generations decode (chunked prefill). The rule:
// a step with decode rows should take at most `factor` times a decode-only step, so a step's time is
// modelled as decode_ms + n_prompt * token_ms, both learned from the steps that ran (moving averages),
// and the prompt chunk is (factor - 1) * decode_ms / token_ms tokens, at least 1. A step without decode
// rows takes the whole budget. Until a decode-only step has been timed, the first step with decode rows
// carries no prompt tokens: it is that measurement. While a prompt is read beside decode rows, every
// refresh_every-th step carries none either, so decode_ms follows the machine (other load, rows that
// came or went) instead of keeping what it was before the prompt arrived. A sample moves an average by
// at most a factor of 2 of it, so one step that the machine slowed or sped up does not double the next
// chunk.
#pragma once

namespace strata {

class prefill_pacer {
public:
    static constexpr int refresh_every = 8;  // steps with prompt tokens between two decode-only ones

    // factor <= 1: no pacing (every step takes the whole budget, as --batch says).
    explicit prefill_pacer(double factor) : factor_(factor) {}

    // Prompt tokens the next step may carry besides `n_decode` decode rows, within `budget` tokens.
    int prompt_tokens(int n_decode, int budget) const;

    // After a step of n_decode decode rows and n_prompt prompt tokens that took ms milliseconds.
    void observe(int n_decode, int n_prompt, double ms);

    double decode_ms() const { return decode_ms_; }  // 0: not measured yet
    double token_ms() const { return token_ms_; }    // 0: not measured yet

private:
    double factor_;
    double decode_ms_ = 0, token_ms_ = 0;
    int mixed_run_ = 0;  // steps with decode rows and prompt tokens since the last decode-only one
};

}  // namespace strata
