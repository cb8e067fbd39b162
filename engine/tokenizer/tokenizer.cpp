#include "tokenizer/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

#include "log.hpp"
#include "tokenizer/models.hpp"
#include "tokenizer/unicode.hpp"
#include "tokenizer/vocab.hpp"

namespace strata::tok {

struct tokenizer::impl {
    vocab v;
    std::optional<pre_splitter> splitter;  // bpe only
    byte_unicode_map bytes;
    std::vector<std::string> piece;           // [n_vocab] bytes each token decodes to
    std::vector<uint8_t> special_only;        // [n_vocab] 1: rendered only when render_special
    std::array<std::vector<int32_t>, 256> specials_by_first_byte;  // v.specials bucketed, longest first

    struct fragment {
        std::string_view text;  // raw text when token < 0
        int32_t token = -1;
    };
    void build_pieces();
    std::vector<fragment> partition(std::string_view text, bool parse_special, std::span<const text_span> plain) const;
    void check_id(int32_t id) const {
        if (id < 0 || id >= v.n_vocab())
            throw std::out_of_range(fmt::format("token id {} is outside the vocabulary of {} tokens", id, v.n_vocab()));
    }
};

// Control, unused and (bpe) unknown tokens show their text only on request; the rest decode to bytes.
void tokenizer::impl::build_pieces() {
    piece.resize(v.text.size());
    special_only.assign(v.text.size(), 0);
    for (int32_t id = 0; id < v.n_vocab(); ++id) {
        const auto i = static_cast<size_t>(id);
        const token_type t = v.type[i];
        if (t == token_type::control || t == token_type::unused || (t == token_type::unknown && v.kind == vocab_kind::bpe)) {
            special_only[i] = 1;
            piece[i] = v.text[i];
        } else {
            piece[i] = v.kind == vocab_kind::bpe ? bpe_piece(v, bytes, id) : spm_piece(v, id);
        }
    }
    for (int32_t id : v.specials)
        specials_by_first_byte[static_cast<uint8_t>(v.text[static_cast<size_t>(id)][0])].push_back(id);
}

// Cuts text at special tokens: user-defined ones always, control ones only when parse_special and
// outside the plain spans. At each position the longest special token that matches wins.
std::vector<tokenizer::impl::fragment> tokenizer::impl::partition(std::string_view text, bool parse_special,
                                                                  std::span<const text_span> plain) const {
    std::vector<fragment> out;
    size_t raw_begin = 0;
    size_t next_plain = 0;  // the first plain span that does not end before pos
    for (size_t pos = 0; pos < text.size();) {
        while (next_plain < plain.size() && plain[next_plain].end <= pos) ++next_plain;
        int32_t match = -1;
        for (int32_t id : specials_by_first_byte[static_cast<uint8_t>(text[pos])]) {
            const std::string& t = v.text[static_cast<size_t>(id)];
            if (v.type[static_cast<size_t>(id)] == token_type::control &&
                (!parse_special || (next_plain < plain.size() && plain[next_plain].begin < pos + t.size())))
                continue;
            if (text.substr(pos).starts_with(t)) {
                match = id;
                break;
            }
        }
        if (match < 0) {
            ++pos;
            continue;
        }
        if (pos > raw_begin) out.push_back({text.substr(raw_begin, pos - raw_begin), -1});
        out.push_back({{}, match});
        pos += v.text[static_cast<size_t>(match)].size();
        raw_begin = pos;
    }
    if (raw_begin < text.size()) out.push_back({text.substr(raw_begin), -1});
    return out;
}

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

tokenizer tokenizer::from_gguf(const gguf::reader& r, const tokenizer_options& opt) {
    auto m = std::make_unique<impl>();
    m->v = load_vocab(r, opt);
    if (m->v.kind == vocab_kind::bpe) m->splitter.emplace(m->v.pre->family);
    m->build_pieces();
    logger("engine")->debug("Tokenizer: {} with {} tokens ({} merges, {} special tokens, pre-split {}), bos {}, eos {}.",
                            m->v.kind == vocab_kind::bpe ? "byte-level BPE" : "SentencePiece BPE", m->v.n_vocab(),
                            m->v.merge_rank.size(), m->v.specials.size(),
                            m->splitter ? m->v.pre_name : "none", m->v.bos, m->v.eos);
    return tokenizer(std::move(m));
}

std::vector<int32_t> tokenizer::encode(std::string_view text, encode_options opt) const {
    const vocab& v = impl_->v;
    std::vector<int32_t> out;
    if (opt.add_special && v.add_bos) out.push_back(v.bos);
    bool prev_special = true;  // spm: a space goes in front of the text and after each special token
    std::string escaped;
    for (const impl::fragment& f : impl_->partition(text, opt.parse_special, opt.plain)) {
        if (f.token >= 0) {
            out.push_back(f.token);
            prev_special = true;
            continue;
        }
        if (v.kind == vocab_kind::bpe && v.missing_bytes && !utf8_valid(f.text)) {
            // Bytes that are not UTF-8 become U+FFFD, as llama.cpp reads all text, when the
            // vocabulary cannot spell every byte.
            bpe_encode(v, *impl_->splitter, impl_->bytes, replace_invalid_utf8(f.text), out);
        } else if (v.kind == vocab_kind::bpe) {
            bpe_encode(v, *impl_->splitter, impl_->bytes, f.text, out);
        } else {
            escaped.clear();
            if (v.add_space_prefix && prev_special) escaped += kSpmSpace;
            for (char c : f.text) {
                if (c == ' ')
                    escaped += kSpmSpace;
                else
                    escaped += c;
            }
            spm_encode(v, escaped, out);
        }
        prev_special = false;
    }
    if (opt.add_special && v.add_eos) out.push_back(v.eos);
    return out;
}

std::string_view tokenizer::token_to_piece(int32_t id, bool render_special) const {
    impl_->check_id(id);
    const auto i = static_cast<size_t>(id);
    if (impl_->special_only[i] && !render_special) return {};
    return impl_->piece[i];
}

std::string tokenizer::decode(std::span<const int32_t> ids, decode_options opt) const {
    std::string out;
    bool strip = opt.strip_space_prefix && impl_->v.add_space_prefix;
    for (int32_t id : ids) {
        std::string_view p = token_to_piece(id, opt.render_special);
        if (strip && !p.empty()) {
            if (p.front() == ' ') p.remove_prefix(1);
            strip = false;
        }
        out += p;
    }
    return out;
}

int32_t tokenizer::n_vocab() const { return impl_->v.n_vocab(); }
vocab_kind tokenizer::kind() const { return impl_->v.kind; }

const std::string& tokenizer::token_text(int32_t id) const {
    impl_->check_id(id);
    return impl_->v.text[static_cast<size_t>(id)];
}

token_type tokenizer::type(int32_t id) const {
    impl_->check_id(id);
    return impl_->v.type[static_cast<size_t>(id)];
}

std::optional<int32_t> tokenizer::find_token(std::string_view text) const {
    const auto it = impl_->v.text_to_id.find(std::string(text));
    if (it == impl_->v.text_to_id.end()) return std::nullopt;
    return it->second;
}

int32_t tokenizer::bos() const { return impl_->v.bos; }
int32_t tokenizer::eos() const { return impl_->v.eos; }
bool tokenizer::add_bos() const { return impl_->v.add_bos; }

bool tokenizer::is_eog(int32_t id) const {
    return std::binary_search(impl_->v.eog.begin(), impl_->v.eog.end(), id);
}

const std::vector<int32_t>& tokenizer::eog_ids() const { return impl_->v.eog; }

std::vector<std::string> tokenizer::pre_split(std::string_view text) const {
    if (!impl_->splitter) throw std::logic_error("pre_split: a SentencePiece vocabulary has no pre-tokenizer");
    std::vector<std::string> out;
    for (std::string_view p : impl_->splitter->split(text)) out.emplace_back(p);
    return out;
}

std::string_view tokenizer::pre_name() const { return impl_->v.pre_name; }

std::string_view tokenizer::pre_family() const {
    return impl_->splitter ? impl_->splitter->family() : std::string_view{};
}

// ---- stream_decoder ----

stream_decoder::stream_decoder(const tokenizer& tok, bool render_special)
    : tok_(&tok), render_special_(render_special) {}

std::string stream_decoder::push(int32_t id) {
    pending_ += tok_->token_to_piece(id, render_special_);
    return take_complete();
}

// Emits every whole character of pending_, U+FFFD for bytes that cannot start or continue one, and
// keeps an incomplete sequence at the end for the next token.
std::string stream_decoder::take_complete() {
    std::string out;
    size_t pos = 0;
    while (pos < pending_.size()) {
        const utf8_seq q = utf8_next(pending_, pos);
        if (q.status == utf8_status::incomplete) break;
        if (q.status == utf8_status::ok)
            out.append(pending_, pos, q.length);
        else
            out += kReplacementChar;
        pos += q.length;
    }
    pending_.erase(0, pos);
    return out;
}

std::string stream_decoder::flush() {
    std::string out = take_complete();
    if (!pending_.empty()) out += kReplacementChar;  // a character the generation never finished
    pending_.clear();
    return out;
}

}  // namespace strata::tok
