// The split patterns of llama.cpp's pre-tokenizers (src/llama-vocab.cpp, llm_tokenizer_bpe), written
// for PCRE2 so that they cut text where llama.cpp's matcher does:
// - llama.cpp runs a pattern that uses \p{..} on a "collapsed" text in which each non-ASCII code point
//   stands as its category; there \p{Lu}, \p{Ll}, ... all mean \p{L}, and \p{S} lacks ASCII '~' (its
//   ASCII table of symbols leaves it out), so the patterns below say [\p{L}..] and exclude '~' there;
// - patterns without \p{..} run on code points where every non-ASCII space counts as \s and matches
//   nothing else, so the literal ranges below leave those spaces out, and \d is ASCII [0-9];
// - gpt2, llama3 and kimi-k2 run as hand-written matchers equal to the patterns given here;
// - each pass sees one piece at a time: a lookahead or \z stops at the piece's end.
#include "tokenizer/pre_patterns.hpp"

namespace strata::tok {

namespace {

// Fragments shared by several families. CONTR is the case-insensitive (?i:'s|'t|...) spelled out.
#define CONTR "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define WS_TAIL R"re(|\s*[\r\n]+|\s+(?!\S)|\s+)re"
#define UPPERISH "(?:(?=\\p{L})[^a-z])"  // a letter other than a-z (llama.cpp's stand-in for Lu/Lt/Lm/Lo)
#define LOWERISH "(?:(?=\\p{L})[^A-Z])"  // a letter other than A-Z (Ll/Lm/Lo)
// Any letter, mark, ... and ASCII symbol except '~' (see above), for the deepseek-v3 style patterns.
#define PS_NO_TILDE R"re((?:(?!~)[\p{P}\p{S}]))re"
#define LEAD_NO_LPS R"re((?:[^\r\n\p{L}\p{P}\p{S}]|~))re"
#define ASCII_PUNCT_WORD R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+)re"

constexpr std::string_view kGpt2 =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kLlama3 =
    CONTR R"re(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)re" WS_TAIL;
constexpr std::string_view kQwen2 = CONTR R"re(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)re" WS_TAIL;

// DeepSeek LLM's letters: the cased letters its tokenizer.json lists (U+1F7D, U+1FBE, U+2126, U+212A
// and the like are the code points the file has, not their canonical equivalents).
constexpr std::string_view kDeepseekLetters =
    R"re(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})re"
    R"re(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})re"
    R"re(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})re"
    R"re(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})re"
    R"re(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})re"
    R"re(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})re"
    R"re(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})re"
    R"re(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})re"
    R"re(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})re"
    R"re(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})re"
    R"re(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})re"
    R"re(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})re"
    R"re(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)re";
// "[一-龥ࠀ-一가-퟿]+" less the spaces inside U+0800-U+4E00.
constexpr std::string_view kDeepseekCjk =
    R"re([\x{0800}-\x{167F}\x{1681}-\x{1FFF}\x{200B}-\x{2027}\x{202A}-\x{202E}\x{2030}-\x{205E}\x{2060}-\x{2FFF})re"
    R"re(\x{3001}-\x{9FA5}\x{AC00}-\x{D7FF}]+)re";
constexpr std::string_view kCjkKana = R"re([\x{4E00}-\x{9FA5}\x{3040}-\x{30FF}]+)re";  // "[一-龥぀-ゟ゠-ヿ]+"
constexpr std::string_view kDeepseek3Main =
    ASCII_PUNCT_WORD "|" LEAD_NO_LPS R"re(?[\p{L}\p{M}]+| ?)re" PS_NO_TILDE R"re(+[\r\n]*)re" WS_TAIL;
// " ?[^(\s|.,!?…。，、।۔،)]+" (BLOOM, Poro, GPT-3 Finnish, Viking).
constexpr std::string_view kBloom =
    R"re( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)re";
// Kimi K2's Han ranges (llama.cpp's unicode_cpt_is_han).
#define HAN                                                                                 \
    R"re([\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}\x{F900}-\x{FAFF})re" \
    R"re(\x{2F800}-\x{2FA1F}])re"

const pre_family kFamilies[] = {
    {"gpt2", {{kGpt2}}},
    {"llama3", {{kLlama3}}},
    {"qwen2", {{kQwen2}}},
    {"qwen35", {{CONTR R"re(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*)re" WS_TAIL}}},
    {"default", {{R"re([\p{P}$+<=>^~|]+)re"}, {kGpt2}, {R"re(\p{N}+)re"}, {"[0-9][0-9][0-9]"}}},
    {"falcon", {{R"re([\p{P}$+<=>^~|`]+)re"}, {kGpt2}, {"[0-9][0-9][0-9]"}}},
    {"starcoder", {{R"re(\p{N})re"}, {kGpt2}}},
    {"jais-2",
     {{CONTR R"re(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+)re"
             R"re(|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S))re"
             R"re(|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1})re"}}},
    {"deepseek-llm",
     {{R"re([\r\n])re"},
      {kDeepseekLetters},
      {R"re(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3001}-\x{3002}]+)re"},
      {R"re(\s+\z)re"},
      {kDeepseekCjk},
      {R"re(\p{N}+)re"}}},
    {"deepseek-coder",
     {{R"re([\r\n])re"}, {R"re(\s?\p{L}+)re"}, {R"re(\s?\p{P}+)re"}, {kDeepseekCjk}, {R"re(\p{N})re"}}},
    {"deepseek-v3", {{R"re(\p{N}{1,3})re"}, {kCjkKana}, {kDeepseek3Main}}},
    {"spark2_5",
     {{R"re(\p{N}{1,3})re"},
      {kCjkKana},
      {ASCII_PUNCT_WORD "|" LEAD_NO_LPS R"re(?[\p{L}\p{M}]+| ?)re" PS_NO_TILDE R"re(+|[\r\n]|\s+(?!\S)|\s+)re"},
      {R"re(\p{N})re"}}},
    {"youtu",
     {{R"re([\x{AC00}-\x{D7A3}\x{3131}-\x{318E}]+)re"
       R"re(|[\x{FF01}\x{2026}\x{201C}\x{201D}\x{2018}\x{2019}\x{2014}\x{FF1A}\x{FF1B}\x{FF0C})re"
       R"re(\x{3001}-\x{303F}\x{FE30}-\x{FE4F}]+)re"
       R"re(|[\x{3105}-\x{312F}]+|[\x{4E00}-\x{9FA5}\x{3040}-\x{30FF}]+)re"},
      {R"re([^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+)re" CONTR R"re(?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*)re" WS_TAIL}}},
    {"bloom", {{kBloom}}},
    {"viking", {{kBloom}, {R"re(\p{N})re"}}},
    {"tekken",
     {{R"re([^\r\n\p{L}\p{N}]?)re" UPPERISH "*" LOWERISH R"re(+|[^\r\n\p{L}\p{N}]?)re" UPPERISH "+" LOWERISH
       R"re(*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*)re" WS_TAIL}}},
    {"chameleon",
     {{"<sentinel:[0-9]+>"},
      {"IMGIMG[A-I]{1,4}Z"},
      {"[\\t\\n]|    |  "},
      {R"re(\p{N})re"},
      {R"re([\p{P}!-/:-@\[-`{-~])re"},
      {kGpt2}}},
    {"gpt-4o",
     {{R"re([^\r\n\p{L}\p{N}]?)re" UPPERISH "*" LOWERISH "+" CONTR R"re(?|[^\r\n\p{L}\p{N}]?)re" UPPERISH "+" LOWERISH
       "*" CONTR R"re(?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*)re" WS_TAIL}}},
    {"granite-embed-multi",
     {{R"re([^\r\n\p{L}\p{N}]?(?:(?=[\p{L}\p{M}])[^a-z])*(?:(?=[\p{L}\p{M}])[^A-Z])+)re" CONTR
       R"re(?|[^\r\n\p{L}\p{N}]?(?:(?=[\p{L}\p{M}])[^a-z])+(?:(?=[\p{L}\p{M}])[^A-Z])*)re" CONTR
       R"re(?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*)re" WS_TAIL}}},
    {"tiny_aya",
     {{R"re(\p{N}+)re", true},
      {R"re([^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+)re" CONTR R"re(?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*)re" WS_TAIL}}},
    {"kimi-k2",
     {{HAN R"re(+|[^\r\n\p{L}\p{N}]?(?:(?!)re" HAN R"re()\p{L})+)re" CONTR
           R"re(?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)re" WS_TAIL}}},
    {"superbpe", {{R"re(\p{N}+)re"}, {"[0-9]+", true}}},
    {"bailingmoe",
     {{R"re('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)re"
       R"re(|\s*[\r\n]|\s+(?!\S)|\s+)re"}}},
    {"seed-coder", {{CONTR R"re(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+)re" WS_TAIL}}},
    {"ufakzeka", {{R"re([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)re" WS_TAIL}}},
    {"afmoe",
     {{R"re(\p{N}+)re", true},
      {R"re([\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{F900}-\x{FAFF}\x{3040}-\x{30FF}\x{FF65}-\x{FF9F}\x{2F00}-\x{2FDF})re"
       R"re(\x{0E40}-\x{0E7F}\x{0E80}-\x{0EFF}\x{1780}-\x{17FF}\x{1000}-\x{109F}\x{AA60}-\x{AA7F}\x{A9E0}-\x{A9FF})re"
       R"re(\x{AC00}-\x{D7AF}\x{1100}-\x{11FF}]+)re"},
      {kDeepseek3Main}}},
    {"laguna", {{R"re([^\n]+|[\n]+)re"}, {kQwen2}}},
    {"exaone-moe",
     {{CONTR R"re(|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?)re"
             R"re(|\s*[\r\n]|\s+(?!\S)|\s+)re"}}},
    {"minicpm5",
     {{R"re(\p{N}{1,3})re"},
      {CONTR R"re(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*)re" WS_TAIL}}},
};

#undef CONTR
#undef WS_TAIL
#undef UPPERISH
#undef LOWERISH
#undef PS_NO_TILDE
#undef LEAD_NO_LPS
#undef ASCII_PUNCT_WORD
#undef HAN

}  // namespace

const pre_family* find_pre_family(std::string_view name) {
    for (const pre_family& f : kFamilies)
        if (f.name == name) return &f;
    return nullptr;
}

}  // namespace strata::tok
