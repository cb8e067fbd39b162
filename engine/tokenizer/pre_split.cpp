#include "tokenizer/pre_split.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

#include <spdlog/fmt/fmt.h>

#include "tokenizer/pre_patterns.hpp"
#include "tokenizer/unicode.hpp"

namespace strata::tok {

namespace {

struct name_entry {
    std::string_view name;
    pre_tokenizer_info info;
};

// tokenizer.ggml.pre values as llama.cpp's loader (src/llama-vocab.cpp, llama_vocab::impl::load) maps
// them to pattern families and defaults.
constexpr pre_tokenizer_info kPlain(std::string_view family) { return {family}; }
constexpr pre_tokenizer_info kWhole(std::string_view family, bool bos) { return {family, true, bos}; }

const name_entry kNames[] = {
    {"default", kPlain("default")},
    {"llama3", kWhole("llama3", true)}, {"llama-v3", kWhole("llama3", true)}, {"llama-bpe", kWhole("llama3", true)},
    {"falcon3", kWhole("llama3", true)}, {"falcon-h1", kWhole("llama3", true)}, {"pixtral", kWhole("llama3", true)},
    {"midm-2.0", kWhole("llama3", true)}, {"lfm2", kWhole("llama3", true)}, {"jina-v5-nano", kWhole("llama3", true)},
    {"dbrx", kPlain("llama3")}, {"smaug-bpe", kPlain("llama3")}, {"glm4", kPlain("llama3")},
    {"chatglm-bpe", kPlain("llama3")},
    {"deepseek-llm", kPlain("deepseek-llm")}, {"deepseek-coder", kPlain("deepseek-coder")},
    {"deepseek-v3", kPlain("deepseek-v3")}, {"hunyuan-dense", kPlain("deepseek-v3")}, {"hy_v4", kPlain("deepseek-v3")},
    {"joyai-llm", kPlain("deepseek-v3")},
    {"spark2_5", kPlain("spark2_5")}, {"youtu", kWhole("youtu", false)}, {"falcon", kPlain("falcon")},
    {"gpt-2", kPlain("gpt2")}, {"mpt", kPlain("gpt2")}, {"olmo", kPlain("gpt2")}, {"jais", kPlain("gpt2")},
    {"phi-2", kPlain("gpt2")}, {"jina-es", kPlain("gpt2")}, {"jina-de", kPlain("gpt2")}, {"gigachat", kPlain("gpt2")},
    {"jina-v2-es", kPlain("gpt2")}, {"jina-v2-de", kPlain("gpt2")}, {"a.x-4.0", kPlain("gpt2")},
    {"mellum", kPlain("gpt2")}, {"modern-bert", kPlain("gpt2")}, {"jina-v1-en", kPlain("gpt2")},
    {"jina-v2-code", kPlain("gpt2")}, {"roberta-bpe", kPlain("gpt2")}, {"exaone4", kPlain("gpt2")},
    {"trillion", kPlain("gpt2")}, {"granite-docling", kPlain("gpt2")},
    {"jais-2", kPlain("jais-2")},
    {"starcoder", kPlain("starcoder")}, {"refact", kPlain("starcoder")}, {"command-r", kPlain("starcoder")},
    {"smollm", kPlain("starcoder")}, {"codeshell", kPlain("starcoder")}, {"exaone", kPlain("starcoder")},
    {"minerva-7b", kPlain("starcoder")}, {"mellum2", kPlain("starcoder")},
    {"qwen2", kPlain("qwen2")}, {"deepseek-r1-qwen", kPlain("qwen2")}, {"kormo", kPlain("qwen2")},
    {"f2llmv2", kPlain("qwen2")}, {"stablelm2", kPlain("qwen2")}, {"megrez", kPlain("qwen2")},
    {"hunyuan", kPlain("qwen2")}, {"solar-open", kPlain("qwen2")}, {"grok-2", kPlain("qwen2")},
    {"qwen35", kPlain("qwen35")},
    {"poro-chat", kPlain("bloom")}, {"bloom", kPlain("bloom")}, {"gpt3-finnish", kPlain("bloom")},
    {"viking", kPlain("viking")},
    {"tekken", kWhole("tekken", true)}, {"chameleon", {"chameleon", false, true}},
    {"gpt-4o", kPlain("gpt-4o")}, {"llama4", kPlain("gpt-4o")}, {"kanana2", kPlain("gpt-4o")},
    {"talkie", kPlain("gpt-4o")}, {"minimax-m2", kPlain("gpt-4o")},
    {"granite-embed-multi-97m", kWhole("granite-embed-multi", false)},
    {"tiny_aya", kPlain("tiny_aya")}, {"cohere2moe", kPlain("tiny_aya")},
    {"superbpe", kPlain("superbpe")},
    {"bailingmoe", kPlain("bailingmoe")}, {"bailingmoe2", kPlain("bailingmoe")}, {"llada-moe", kPlain("bailingmoe")},
    {"seed-coder", kPlain("seed-coder")}, {"kimi-k2", {"kimi-k2", false, false, true}},
    {"ufakzeka", kPlain("ufakzeka")}, {"afmoe", kPlain("afmoe")}, {"laguna", kPlain("laguna")},
    {"exaone-moe", kPlain("exaone-moe")}, {"minicpm5", kWhole("minicpm5", false)},
};

// Names llama.cpp maps to tokenizers that are not byte-level BPE over GPT-2 byte symbols.
constexpr std::string_view kNotByteLevel[] = {"gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace"};

// llama.cpp's whitespace: Python's \s over Unicode (U+0085 included, U+001C-U+001F not).
constexpr std::string_view kSpaceItems =
    R"re(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})re";

// Writes \s and \S out as classes of kSpaceItems; everything else is passed through.
std::string expand_spaces(std::string_view p) {
    std::string out;
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            const char e = p[++i];
            if (e == 's') {
                out += in_class ? std::string(kSpaceItems) : fmt::format("[{}]", kSpaceItems);
            } else if (e == 'S' && !in_class) {
                out += fmt::format("[^{}]", kSpaceItems);
            } else if (e == 'S') {
                throw std::logic_error(fmt::format("pre-tokenizer pattern {}: \\S inside a class", p));
            } else {
                out += c;
                out += e;
            }
            continue;
        }
        if (c == '[' && !in_class) in_class = true;
        else if (c == ']' && in_class) in_class = false;
        out += c;
    }
    return out;
}

std::string pcre2_message(int code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(code, buf, sizeof buf);
    return reinterpret_cast<const char*>(buf);
}

// Per-thread match state: one ovector pair is all the splitter reads, and a JIT stack large enough
// for the patterns whose repeats backtrack over long runs of letters.
struct match_scratch {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    match_scratch() {
        if (!data || !context) throw std::bad_alloc();
        if (jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
    ~match_scratch() {
        pcre2_jit_stack_free(jit_stack);
        pcre2_match_context_free(context);
        pcre2_match_data_free(data);
    }
    match_scratch(const match_scratch&) = delete;
    match_scratch& operator=(const match_scratch&) = delete;
};

match_scratch& scratch() {
    thread_local match_scratch s;
    return s;
}

size_t next_char(std::string_view s, size_t pos) {
    const utf8_seq q = utf8_next(s, pos);
    return pos + (q.status == utf8_status::ok ? q.length : 1);
}

}  // namespace

const pre_tokenizer_info* find_pre_tokenizer(std::string_view name) {
    for (const name_entry& e : kNames)
        if (e.name == name) return &e.info;
    for (std::string_view n : kNotByteLevel)
        if (n == name)
            throw std::runtime_error(fmt::format("tokenizer.ggml.pre '{}' is llama.cpp's BPE over raw UTF-8 without "
                                                 "GPT-2 byte symbols, which strata does not run",
                                                 name));
    return nullptr;
}

std::string known_pre_tokenizer_names() {
    std::string out;
    for (const name_entry& e : kNames) out += fmt::format("{}{}", out.empty() ? "" : ", ", e.name);
    return out;
}

struct pre_splitter::impl {
    struct pass {
        pcre2_code* code = nullptr;
        bool digit_groups = false;
    };
    std::string_view family;
    std::vector<pass> passes;

    ~impl() {
        for (pass& p : passes) pcre2_code_free(p.code);
    }
    // Index of the first match at or after pos (an empty one counts), or false; throws on PCRE2 errors.
    bool match(const pass& p, std::string_view s, size_t pos, uint32_t options, size_t& begin, size_t& end) const;
    void isolate(const pass& p, std::string_view piece, std::vector<std::string_view>& out) const;
    void group_digits(const pass& p, std::string_view piece, std::vector<std::string_view>& out) const;
};

bool pre_splitter::impl::match(const pass& p, std::string_view s, size_t pos, uint32_t options, size_t& begin,
                               size_t& end) const {
    match_scratch& m = scratch();
    const int rc = pcre2_match(p.code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, options, m.data,
                               m.context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0)
        throw std::runtime_error(fmt::format("the {} pre-tokenizer failed at byte {} of a {}-byte piece: {}", family,
                                             pos, s.size(), pcre2_message(rc)));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
    begin = ov[0];
    end = ov[1];
    return true;
}

// The matches and the unmatched runs between them, in order. After an empty match the next match
// may not be empty at the same place, as in std::regex_iterator (a lookahead-only pattern cuts there).
void pre_splitter::impl::isolate(const pass& p, std::string_view piece, std::vector<std::string_view>& out) const {
    size_t pos = 0, gap = 0;
    uint32_t options = 0;
    while (pos < piece.size()) {
        size_t begin = 0, end = 0;
        if (!match(p, piece, pos, options, begin, end)) {
            if (options == 0) break;
            options = 0;
            pos = next_char(piece, pos);
            continue;
        }
        if (begin > gap) out.push_back(piece.substr(gap, begin - gap));
        if (end > begin) out.push_back(piece.substr(begin, end - begin));
        gap = pos = end;
        options = end == begin ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    }
    if (gap < piece.size()) out.push_back(piece.substr(gap));
}

// Each run the pattern matches, in groups of three characters counted from its end; the text before
// a run goes with its first group, the text after the last run is a piece of its own.
void pre_splitter::impl::group_digits(const pass& p, std::string_view piece, std::vector<std::string_view>& out) const {
    size_t pos = 0, cut = 0;
    size_t begin = 0, end = 0;
    while (pos < piece.size() && match(p, piece, pos, 0, begin, end)) {
        if (end == begin) {
            pos = next_char(piece, begin);
            continue;
        }
        std::vector<size_t> starts;  // byte offset of each character of the run
        for (size_t i = begin; i < end; i = next_char(piece, i)) starts.push_back(i);
        const size_t n = starts.size();
        for (size_t k = n % 3 == 0 ? 3 : n % 3; k <= n; k += 3) {
            const size_t group_end = k == n ? end : starts[k];
            out.push_back(piece.substr(cut, group_end - cut));
            cut = group_end;
        }
        pos = end;
    }
    if (cut < piece.size()) out.push_back(piece.substr(cut));
}

pre_splitter::pre_splitter(std::string_view family) : impl_(std::make_unique<impl>()) {
    const pre_family* f = find_pre_family(family);
    if (!f) throw std::runtime_error(fmt::format("no pre-tokenizer family '{}'", family));
    impl_->family = f->name;
    for (const pre_pass& pp : f->passes) {
        const std::string p = expand_spaces(pp.pattern);
        int err = 0;
        PCRE2_SIZE err_offset = 0;
        // MATCH_INVALID_UTF: invalid bytes simply never match instead of failing the whole call.
        pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
        if (!code)
            throw std::runtime_error(fmt::format("the {} pre-tokenizer pattern {} does not compile at offset {}: {}",
                                                 f->name, impl_->passes.size(), err_offset, pcre2_message(err)));
        impl_->passes.push_back({code, pp.digit_groups});
        pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: the interpreter is used without it
    }
}

pre_splitter::pre_splitter(pre_splitter&&) noexcept = default;
pre_splitter& pre_splitter::operator=(pre_splitter&&) noexcept = default;
pre_splitter::~pre_splitter() = default;

std::string_view pre_splitter::family() const { return impl_->family; }

std::vector<std::string_view> pre_splitter::split(std::string_view text) const {
    std::vector<std::string_view> pieces, next;
    if (text.empty()) return pieces;
    pieces.push_back(text);
    for (const impl::pass& p : impl_->passes) {
        next.clear();
        for (std::string_view piece : pieces) {
            if (p.digit_groups)
                impl_->group_digits(p, piece, next);
            else
                impl_->isolate(p, piece, next);
        }
        pieces.swap(next);
    }
    return pieces;
}

}  // namespace strata::tok
