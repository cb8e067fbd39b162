// Picks the next token from the model's logits: logit bias, repetition / presence / frequency penalties, then
// greedy or top-k -> top-p -> min-p -> temperature -> a seeded draw (llama.cpp's default order), and
// the log-probabilities OpenAI's `logprobs` / `top_logprobs` report.
//
// Log-probabilities are those of the model's distribution after bias, penalties and temperature, over
// the whole vocabulary and before top-k/top-p/min-p truncation: log_softmax(penalised logits / T), with
// T = 1 when sampling is greedy. So they describe the model, not the truncated sampler, and a token
// the filters removed still has its honest (finite) value.
//
// Thread-safety: a sampler holds one generation's history and random state; use it from one thread
// at a time. Different samplers are independent.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::tok {

struct sampler_params {
    float temperature = 0.8f;        // <= 0: greedy (argmax of the penalised logits)
    int32_t top_k = 40;              // <= 0: off
    float top_p = 0.95f;             // >= 1: off
    float min_p = 0.05f;             // <= 0: off; keeps tokens with p >= min_p * p(most likely)
    float repeat_penalty = 1.0f;     // 1: off; llama.cpp: positive logits divided, negative multiplied
    int32_t repeat_last_n = 64;      // tokens (prompt and generated) the repetition penalty looks back; -1: all
    float presence_penalty = 0.0f;   // OpenAI: minus this once for every token generated at least once
    float frequency_penalty = 0.0f;  // OpenAI: minus this times the token's count in the generated text
    std::optional<uint64_t> seed;    // the same seed and logits give the same tokens; none: random
    // OpenAI logit_bias: added to these ids' logits before the penalties (greedy included). An id
    // outside the logits is ignored; a bias outside [-100, 100] is refused.
    std::vector<std::pair<int32_t, float>> logit_bias;
};

struct token_logprob {
    int32_t id;
    float logprob;
};

struct sample_result {
    int32_t id;
    float logprob;                             // of the chosen token (see the note at the top)
    std::vector<token_logprob> top_logprobs;   // the n most likely, most likely first (ties: lower id)
};

class sampler {
public:
    // Throws std::invalid_argument naming a parameter outside its range.
    explicit sampler(sampler_params p);

    // Draws the next token from logits [n_vocab] and records it as generated. n_top_logprobs > 0 fills
    // sample_result::top_logprobs; < 0 skips the log-probabilities (logprob 0: no pass over the
    // vocabulary for them). Throws std::invalid_argument when no logit is finite.
    sample_result sample(std::span<const float> logits, int n_top_logprobs = 0);

    // Prompt tokens: seen by the repetition penalty, not by presence/frequency (OpenAI counts only
    // the generated text).
    void accept_prompt(std::span<const int32_t> ids);
    // A generated token that was not drawn here (forced, or from a draft); sample() records its own.
    void accept(int32_t id);
    // Forgets the history and restarts the random sequence from the seed.
    void reset();

    // The logit bias and the penalties sample() applies, in place (exposed for tests and for logit
    // inspection).
    void apply_penalties(std::span<float> logits) const;

    const sampler_params& params() const { return params_; }

    struct candidate {
        float logit;
        int32_t id;
    };

private:
    int32_t draw(std::span<const float> logits);
    bool penalizes() const;  // whether apply_penalties changes anything

    sampler_params params_;
    uint64_t seed_;
    std::mt19937_64 rng_;
    std::vector<int32_t> history_;                    // prompt and generated ids, in order
    std::unordered_map<int32_t, int32_t> generated_;  // generated id -> count
    // Scratch reused from token to token (vocabulary-sized: no allocation per token once grown).
    std::vector<float> penalized_;
    std::vector<candidate> candidates_;
    std::vector<double> weights_;
};

}  // namespace strata::tok
