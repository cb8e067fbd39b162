// strata's engine API: load a GGUF Mixture-of-Experts model, open sessions, generate text with a
// per-token callback and cancellation, tokenize, apply the chat template, read statistics.
//
// Thread-safety: a model may be shared by any number of threads and sessions; its forward passes run
// on the model's own engine thread (the thread that owns the CPU expert pool), where concurrent
// generate() calls on different sessions advance together, one step (forward pass) for all at a time. Every copy into or out of
// the conversation cache runs on that thread too. A session is used by one
// thread at a time, except cancel(), which any thread may call at any time.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata {

struct model_options {
    std::string path;
    int n_ctx = 0;                    // context length; 0: the model's training context (each session's KV
                                      // cache grows in chunks as its context fills, up to this)
    int n_batch = 512;                // prompt tokens per forward batch
    // Chunked prefill beside decoding generations: a step carrying prompt tokens should take at most
    // this many times a decode-only step (the chunk follows from the measured step times; <= 1: off,
    // every step fills n_batch).
    double prefill_pace = 2.0;
    std::string kv_type = "f16";      // "f16" | "int8"
    std::string numa_pool;            // "auto" | "off" | "on" | "test" | "test:N"; empty: STRATA_NUMA_POOL
    std::optional<int> pool_workers;  // empty: TBB_NUM_THREADS, else the pool plan's default
    std::string chat_template;        // "chatml" | "mistral" | "llama3" | a Jinja file; empty: from the model
    std::string override_pre;         // --override-pre NAME: tokenizer.ggml.pre to use instead of the file's
    // Split-off pool on a multi-node machine: claim the resident experts on this NUMA node before
    // anything else reads the model ("N"; "auto": the NUMA node of --gpu, off without one); "off" or
    // empty: not one NUMA system call.
    std::string numa_hot_node;
    bool mmap_experts = false;        // split off: read experts from the mapped file instead of a RAM copy
    // --no-repack clears it: keep the experts (Q2_K-Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS,
    // MXFP4), and on CPU-only runs the dense matrices of those types, in the layout of the CPU's prompt GEMM
    // kernels (AVX-512: 16 rows interleaved; decode reads it too).
    bool repack = true;
    // GPU hybrid (docs/GPU.md). gpu < 0: CPU only. Without a usable device (or a build without CUDA)
    // the engine logs why in one line and runs CPU-only.
    int gpu = -1;                     // --gpu N: CUDA device index
    std::string expert_cache = "auto";  // --expert-cache auto|GIB: VRAM for routed experts
    int vram_reserve_mib = 512;       // --vram-reserve-mib: VRAM left free for the driver and others
    // --gpu-sessions N: sessions whose KV caches VRAM holds at once (the server runs one at a time); a
    // further session takes the least recently used one's VRAM cache. The rest of the VRAM holds experts.
    int gpu_sessions = 1;
    std::string expert_profile;       // --expert-profile FILE: fill the expert cache from these counts
    std::string profile_save;         // --profile-save FILE: write routed counts when the model unloads
    int adapt_every = 0;              // --adapt-every N: decode steps between expert swaps (0: off)
    int adapt_swaps = 4;              // --adapt-swaps N: experts swapped in per adaptation at most
    bool adapt_async = false;         // --adapt-async 1: copies land in the background, off the decode path
    // RoPE overrides with llama.cpp's flags and meanings (docs/DETAILS.md); the defaults keep the model's.
    std::string rope_scaling;         // --rope-scaling none|linear|yarn; empty: the model's
    float rope_scale = 0;             // --rope-scale N: context scaling factor (angles / N); 0: the model's
    float rope_freq_base = 0;         // --rope-freq-base: RoPE base frequency; 0: the model's
    int yarn_orig_ctx = 0;            // --yarn-orig-ctx N: YaRN original context; 0: the model's
    float yarn_ext_factor = -1;       // --yarn-ext-factor: extrapolation mix; < 0: the model's (1 under yarn)
    float yarn_attn_factor = -1;      // --yarn-attn-factor: scale on cos/sin; < 0: the model's (1)
    float yarn_beta_fast = -1;        // --yarn-beta-fast; < 0: the model's (32)
    float yarn_beta_slow = -1;        // --yarn-beta-slow; < 0: the model's (1)
    // --cache-ram MIB: memory for parked conversation snapshots (the conversation cache); -1: the
    // smaller of 25 % of MemAvailable and 8 GiB; 0: off.
    int cache_ram_mib = -1;
    // --mem-budget MIB: one budget for every session's KV cache, their recurrent-state checkpoints and
    // the conversation snapshots; -1: 90 % of the memory the system and this process's cgroup can still
    // give once the weights are loaded; 0: none (each growth is checked against free memory only).
    int mem_budget_mib = -1;
    // Hybrid models (qwen35moe, qwen3next): a checkpoint of the recurrent state every this many
    // positions (0: only where a prompt's new tokens start and where it ends).
    int state_checkpoint_interval = 1024;
    // Time each part of the CPU forward pass during decode (timings::decode_phases; strata-bench model
    // --breakdown). Costs two clock reads per part and layer.
    bool phase_timing = false;
};

struct sampling_options {
    float temperature = 0.8f;        // <= 0: greedy
    int top_k = 40;                  // <= 0: off
    float top_p = 0.95f;             // >= 1: off
    float min_p = 0.05f;             // <= 0: off
    float repeat_penalty = 1.0f;     // 1: off (llama.cpp semantics)
    int repeat_last_n = 64;
    float presence_penalty = 0.0f;   // OpenAI semantics
    float frequency_penalty = 0.0f;
    std::optional<uint64_t> seed;    // the same seed, prompt and model give the same text
    // OpenAI logit_bias: (token id, bias) pairs added to the logits before penalties and sampling
    // (greedy included); ids are within the vocabulary, biases within [-100, 100].
    std::vector<std::pair<int32_t, float>> logit_bias;
};

// Speculative decoding: each step drafts tokens and the model verifies them with the last token in one
// batch. The output is the same token for token as without it, greedy or seeded sampling alike (a
// draft is kept when the sampler, drawing from the verified logits, picks it).
struct speculation_options {
    // "off" | "ngram": drafts from the context (prompt lookup), n_max each step | "auto": n-gram drafts,
    // their number chosen each step from the measured cost of a verification and the running
    // acceptance rate, 0 when drafting does not pay | "mtp": the file's next-token-prediction block
    // (not implemented yet: a request_error) | "forced": drafts from `forced` (benchmarks and tests).
    std::string type = "off";
    int n_max = 4;                   // drafts per step at most (1..16)
    float min_p = 0.5f;              // MTP: stop drafting when the draft's own probability is below this
    int ngram_min = 2;               // n-gram drafts: the shortest run of last tokens matched (1..4)
    // "forced": the draft for generated token i is forced[i] (a known continuation, or one altered to
    // give a chosen acceptance rate), n_max of them each step.
    std::vector<int32_t> forced;
};

struct generation_options {
    int max_tokens = 256;            // tokens to generate at most (also bounded by the context)
    sampling_options sampling;
    speculation_options speculation;
    std::vector<std::string> stop;   // stop strings (not part of the returned text)
    int top_logprobs = 0;            // > 0: that many alternatives per token, with log-probabilities
    bool logprobs = false;           // record the chosen tokens' log-probabilities
    bool ignore_eos = false;         // keep generating past end-of-generation tokens
    // Who may reuse this prompt's cached prefix: a prompt reuses the session's state or a parked
    // snapshot only when they were left under the same scope ("" for unscoped callers).
    std::string cache_scope;
};

struct token_logprob {
    int32_t id = 0;
    std::string text;                // the token's bytes (may be part of a UTF-8 character)
    float logprob = 0;
};

struct generated_token {
    int32_t id = 0;
    float logprob = 0;               // filled when logprobs or top_logprobs was asked for
    std::vector<token_logprob> top; // most likely first
};

// One callback per generated token: `text` is the text that became final with it (complete UTF-8
// characters not held back by a possible stop string; may be empty). Return false to stop. At the end
// of a generation that held back bytes, one more call with `flush` set hands them over (its `token` is
// the last one again).
struct token_event {
    const generated_token& token;
    std::string_view text;
    bool flush = false;
};
using token_callback = std::function<bool(const token_event&)>;

enum class stop_reason { eos, stop_string, length, cancelled };

// Where a prompt's reused prefix came from: nowhere, the session's own KV cache, or a parked snapshot.
enum class prefix_source { none, live, snapshot };
std::string_view prefix_source_name(prefix_source s);  // "none" | "live" | "snapshot"
std::string_view stop_reason_name(stop_reason r);  // "stop" | "stop" | "length" | "cancelled"

// One part of the decode forward passes of a generation (model_options::phase_timing): wall time and
// the weight and KV bytes that part read, summed over the passes.
struct phase_time {
    std::string name;
    double ms = 0;
    uint64_t bytes = 0;
};

struct timings {
    int prompt_n = 0;                // prompt tokens evaluated (after reuse)
    int cache_n = 0;                 // prompt tokens reused: the session's KV cache or a restored snapshot
    double prompt_ms = 0;
    int predicted_n = 0;
    double predicted_ms = 0;
    // GPU hybrid only (zero CPU-only): this generation's routed expert lookups (tokens evaluated x MoE
    // layers x n_expert_used), and those served by experts resident in VRAM.
    uint64_t expert_lookups = 0;
    uint64_t vram_hits = 0;
    prefix_source cache_source = prefix_source::none;
    uint64_t cache_snapshot = 0;     // the snapshot restored (cache_source snapshot)
    // With model_options::phase_timing on a CPU-only model: the decode passes (predicted_n - 1 of them)
    // by part, in forward order; "other" is what no part covers (embedding, norms, residual adds).
    std::vector<phase_time> decode_phases;
    int decode_passes = 0;
    // The same for the prompt's passes that ran alone in their step (prompt_n tokens when alone).
    std::vector<phase_time> prompt_phases;
    // Speculative decoding: tokens drafted, drafts the model accepted, verification batches run.
    int spec_drafted = 0;
    int spec_accepted = 0;
    int spec_verifications = 0;
    double spec_acceptance() const { return spec_drafted > 0 ? double(spec_accepted) / spec_drafted : 0.0; }
    double prompt_per_second() const { return prompt_ms > 0 ? prompt_n * 1000.0 / prompt_ms : 0; }
    double predicted_per_second() const { return predicted_ms > 0 ? predicted_n * 1000.0 / predicted_ms : 0; }
};

struct generation_result {
    std::string text;
    std::vector<generated_token> tokens;
    stop_reason reason = stop_reason::eos;
    timings time;
};

struct chat_message {
    std::string role;                // "system" | "user" | "assistant"
    std::string content;
};

struct pool_slice_info {
    int node = -1;                   // NUMA node (-1: none; test mode: the slice index)
    int threads = 0;                 // workers, plus the host thread in its own slice
    std::vector<int> cores;
};

struct model_info {
    std::string path;
    std::string architecture;        // "qwen3moe" | "qwen2moe" | "mixtral" | "glm4moe" | "deepseek2" | "qwen35moe" | "qwen3next"
    std::string name;
    int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
    int n_rot = 0;                   // dims of a head RoPE rotates
    int kv_lora_rank = 0;            // deepseek2's latent attention: the cached latent's size (0: none)
    int n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
    int n_vocab = 0;
    int n_ctx = 0, n_ctx_train = 0, n_batch = 0;
    std::string kv_type;
    std::string chat_format;         // the chat template in use
    uint64_t file_bytes = 0;
    uint64_t kv_bytes_per_session = 0;   // a full context's KV cache (allocated as the context fills)
    int kv_chunk_tokens = 0;             // positions per KV cache allocation
    uint64_t kv_bytes_per_token = 0;     // keys and values of one position, every layer
    int n_kv_layers = 0;                 // the layers kv_bytes_per_token covers
    // qwen4exp's QSA layers (sparse attention, among the n_kv_layers): each one's tokens per indexer
    // block; the indexer's token budget, heads and key length. Empty / 0 without QSA.
    std::vector<int> qsa_ratios;
    int qsa_top_k = 0, qsa_heads = 0, qsa_key_length = 0;
    // Hybrid models: the gated DeltaNet layers' recurrent state (conv and SSM state, f32), one per
    // session and one per checkpoint; 0 for pure-attention models, whose every layer has a KV cache.
    int n_recurrent_layers = 0;
    uint64_t state_bytes_per_session = 0;
    int state_checkpoint_interval = 0;
    // The CPU expert pool.
    bool pool_split = false;
    bool pool_test_mode = false;
    std::string pool_reason;
    std::vector<pool_slice_info> pool_slices;
    // Where the resident routed experts landed (sampled with move_pages where placement was asked for).
    struct node_share {
        int slice = 0;
        int node = -1;               // intended NUMA node
        uint64_t bytes = 0;
        double share = 0;            // fraction of sampled pages found on `node`
        bool ok = true;              // share at or above 95 %
    };
    std::string placement_mode;      // "split" | "test" | "copy" | "mapped"
    std::string placement;           // one line: "node 0 100.0 %, node 1 99.6 %" or "one copy, 1.2 GiB"
    uint64_t expert_bytes = 0;       // bytes of routed experts copied into RAM
    std::vector<node_share> placement_nodes;
    std::string region_map_path;     // where placement-report --pid reads this process's regions
    // The GPU hybrid: true when sessions run on the GPU (--gpu with a usable device); with --gpu but
    // CPU-only, the reason the engine logged ("strata was built without CUDA ...", "no CUDA device ...").
    bool gpu_hybrid = false;
    std::string gpu_cpu_only_reason;
};

// Routing statistics since the model was loaded.
struct expert_stats {
    uint64_t tokens = 0;                    // tokens evaluated
    std::vector<uint64_t> counts;           // [n_layer][n_expert]: times each expert was routed to
    // GPU hybrid only (zero CPU-only): routed lookups, and those served by experts resident in VRAM.
    uint64_t expert_lookups = 0;
    uint64_t vram_hits = 0;
    double hit_rate() const { return expert_lookups ? double(vram_hits) / double(expert_lookups) : 0.0; }
};

// Speculative decoding since the model was loaded, and the cost curve `auto` uses: the wall time of a
// forward pass of n tokens (n = 1..17) as measured on this model, with how many passes it averages.
struct speculation_stats {
    uint64_t drafted = 0;
    uint64_t accepted = 0;
    uint64_t verifications = 0;
    uint64_t turned_off = 0;                // generations in which `auto` turned drafting off
    struct pass_cost {
        int tokens = 0;
        double ms = 0;
        int passes = 0;
    };
    std::vector<pass_cost> costs;           // measured sizes only, by tokens
    double acceptance() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
};

// The conversation cache: KV snapshots of sessions parked when a session moved on to an unrelated
// prompt (or on session::park()), restored when a prompt shares a longer prefix with one of them than
// with the session's own cache. Least recently used snapshots are evicted to stay under the budget.
struct conversation_cache_entry {
    uint64_t id = 0;
    int tokens = 0;
    uint64_t bytes = 0;
    double last_use_s = 0;           // parked or restored, seconds since the Unix epoch
};

struct conversation_cache_stats {
    bool enabled = false;            // --cache-ram other than 0
    uint64_t budget_bytes = 0;
    uint64_t bytes = 0;              // held by the snapshots (segments, and recurrent states)
    uint64_t segments = 0;
    int node = -1;                   // NUMA node the segments are bound to (the cold node); -1: anonymous
    double node_share = 0;           // sampled share of the segments' pages on `node` (0 when node is -1)
    uint64_t parked = 0;             // snapshots made (superseded and evicted ones included)
    uint64_t hits = 0;               // prompts that restored a snapshot
    uint64_t misses = 0;             // prompts for which no snapshot beat the session's own cache
    uint64_t tokens_restored = 0;    // tokens copied back from snapshots
    uint64_t evictions = 0;          // snapshots dropped for the budget
    uint64_t state_checkpoints = 0;  // hybrid models: recurrent states the snapshots keep
    uint64_t state_bytes = 0;        // their bytes (in `bytes` too)
    std::vector<conversation_cache_entry> entries;  // most recently used first
};

// The memory budget (--mem-budget) and what draws from it, in host memory.
struct memory_budget_stats {
    uint64_t budget_bytes = 0;       // 0: no budget
    uint64_t kv_bytes = 0;           // every session's KV cache (not the GPU hybrid's, in VRAM)
    uint64_t checkpoint_bytes = 0;   // every session's recurrent-state checkpoints (hybrid models)
    uint64_t snapshot_bytes = 0;     // the conversation cache's snapshots
    uint64_t evictions = 0;          // snapshots evicted to make room in the budget
    uint64_t refusals = 0;           // KV cache growths refused (kv_cache_full) for the budget
    uint64_t used() const { return kv_bytes + checkpoint_bytes + snapshot_bytes; }
};

// The step batcher's counters: generations in flight advance together, one forward pass per step.
struct batch_stats {
    uint64_t steps = 0;              // forward passes run for generations
    uint64_t rows = 0;               // tokens those passes evaluated
    uint64_t bytes = 0;              // weight and KV bytes they read (dense once per pass, the experts the
                                     // pass's rows touched, each row's cache); CPU forward pass only
    int active = 0;                  // generations in flight (reading their prompt or decoding)
    int waiting = 0;                 // generations submitted, not yet started
    int last_step_rows = 0;
    int max_step_rows = 0;
    bool sequences_in_one_pass = false;  // false: a step evaluates its sequences in turn (latent attention,
                                         // recurrent layers, the GPU hybrid)
    // With model_options::phase_timing on a CPU-only model: the steps of two or more decode rows and no
    // prompt tokens, by part of the pass (as timings::decode_phases), then "batcher": the step's time after
    // the pass (sampling, token callbacks).
    std::vector<phase_time> step_phases;
    uint64_t timed_steps = 0;
};

// Thrown for a request that cannot run (a prompt longer than the context, bad sampling values); the
// message names the numbers. Load failures throw std::runtime_error.
struct request_error : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

// A file-backed region the forward pass reads a few rows at a time and that is never copied, placed,
// pinned or counted in the resident weights: qwen4exp's PLE table. Counters since load.
struct cold_region_stats {
    std::string name;              // "ple table" (per_layer_token_embd)
    std::string where;             // "file-backed: FILE bytes A..B, page cache, no NUMA placement"
    uint64_t bytes_mapped = 0;
    uint64_t bytes_resident = 0;   // of those, in the page cache now (mincore)
    uint64_t tokens = 0;           // tokens evaluated through it
    uint64_t rows_read = 0;        // rows gathered for them
    uint64_t page_faults = 0;      // major faults during the gathers: rows the page cache did not hold
};

class session;

class model {
public:
    // Maps and validates the file, builds the CPU expert pool, binds the weights. Throws
    // std::runtime_error naming the file, tensor, key or setting that is wrong.
    static std::shared_ptr<model> load(const model_options& options);
    ~model();

    const model_info& info() const;
    expert_stats statistics() const;
    // The conversation cache's counters and snapshots. Safe from any thread; does not wait for the
    // engine thread.
    conversation_cache_stats conversation_statistics() const;
    // The cold file-backed regions (qwen4exp's PLE table; empty for other models). Safe from any thread.
    std::vector<cold_region_stats> cold_regions() const;
    // Speculative decoding's counters and measured costs. Safe from any thread.
    speculation_stats speculation_statistics() const;
    // The step batcher's counters. Safe from any thread; does not wait for the engine thread.
    batch_stats batching() const;
    // The memory budget and its use. Safe from any thread; does not wait for the engine thread.
    memory_budget_stats memory_statistics() const;

    std::vector<int32_t> tokenize(std::string_view text, bool add_special = true, bool parse_special = false) const;
    // render_special: control tokens ("<|im_start|>") come out as their text instead of nothing.
    std::string detokenize(std::span<const int32_t> ids, bool render_special = false) const;
    std::string token_text(int32_t id) const;
    bool is_end_of_generation(int32_t id) const;
    // Renders messages with the model's chat template (or the override); throws request_error on an
    // unknown role.
    std::string apply_chat_template(std::span<const chat_message> messages, bool add_generation_prompt = true) const;
    // The chat prompt's tokens (bos, the template's markup with its control tokens, the assistant turn
    // opened). Message content is text: a control token written in it ("<|im_end|>") is tokenized as
    // the characters it is made of, unless special_in_content. Throws request_error like
    // apply_chat_template.
    std::vector<int32_t> tokenize_chat(std::span<const chat_message> messages, bool special_in_content = false) const;
    // The chat prompt of an OpenAI-style request, given as a JSON object: "messages" with every field
    // they carry (content parts, tool_calls, tool_call_id, reasoning_content), "tools",
    // "add_generation_prompt" and the template's keyword arguments (enable_thinking, ...). text is
    // the rendered prompt. Throws request_error "chat template: line N: ..." when the template fails.
    struct chat_prompt {
        std::vector<int32_t> tokens;
        std::string text;
    };
    chat_prompt tokenize_chat_context(std::string_view context_json, bool special_in_content = false) const;

    struct impl;

private:
    friend class session;
    explicit model(std::unique_ptr<impl> p);
    std::unique_ptr<impl> impl_;
};

class session {
public:
    explicit session(std::shared_ptr<model> m);
    ~session();
    session(const session&) = delete;
    session& operator=(const session&) = delete;

    // Generates a continuation of `prompt` (token ids). The longest prefix shared with the tokens
    // already in this session's KV cache, or with a snapshot in the model's conversation cache, is
    // reused (timings.cache_n, cache_source); before a prompt replaces most of this session's state,
    // that state is parked as a snapshot. Throws request_error when the prompt does not fit the
    // context. The callback runs on the model's engine thread.
    generation_result generate(std::span<const int32_t> prompt, const generation_options& options,
                               const token_callback& on_token = {});

    // generate() without waiting: the generation joins the model's step batcher, where the generations
    // of all sessions advance together (each step: the next token of every decoding generation, then
    // prompt chunks, up to n_batch tokens). The logits of each are bitwise those of running alone.
    // on_token runs on the engine thread and should not block (it holds up every generation); `ready`,
    // polled there before each of this generation's decode steps, may return false to hold this
    // generation back (its reader is behind) while the others go on. Validation errors throw here;
    // the future holds the result or what the generation threw. One generation per session at a time.
    std::future<generation_result> start(std::span<const int32_t> prompt, const generation_options& options,
                                         token_callback on_token = {}, std::function<bool()> ready = {});

    // Stops the generation in progress at its next prompt batch or token (reason `cancelled`); a no-op
    // when idle (generate() clears it on entry).
    // Safe from any thread.
    void cancel();

    // Logits after evaluating `prompt` from position 0 ([n_vocab] per token when all, else of the last
    // token only). For tests and tools; clears this session's cache.
    std::vector<float> evaluate(std::span<const int32_t> prompt, bool all = false);

    // For benchmarks: this session's state as if `tokens` had been evaluated from position 0, without
    // computing them: every key, value, QSA indexer key and recurrent state value is pseudo-random
    // (seeded: the same every run), the positions advance and the tokens are kept for prefix reuse. A
    // later prompt that starts with them evaluates only the rest, doing the real work of its depth, but
    // the logits are not the model's. CPU only: throws request_error with the GPU hybrid, or when the
    // tokens do not fit the context.
    void fill_synthetic(std::span<const int32_t> tokens, uint64_t seed = 1);

    // Parks a copy of this session's KV state (its tokens and their keys and values) in the model's
    // conversation cache, which a later prompt of any session may restore; the session keeps its
    // state. Returns the snapshot's id, or 0 when nothing was parked (empty session, cache off, over
    // the budget). Runs on the engine thread.
    uint64_t park();

    // Tokens in this session's KV cache (grows during a prompt's evaluation). Safe from any thread.
    size_t cached_tokens() const;
    // Bytes this session's KV cache has allocated so far (model_info::kv_bytes_per_session at most).
    // Safe from any thread.
    size_t kv_bytes() const;
    // Hybrid models: the recurrent state's checkpoints this session keeps, and their bytes.
    size_t state_checkpoints() const;
    size_t state_checkpoint_bytes() const;

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

}  // namespace strata
