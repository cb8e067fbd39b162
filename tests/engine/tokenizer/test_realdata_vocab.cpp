// Real vocabularies (llama.cpp's vocabulary-only GGUF files of real models, in ../shared/realdata/vocab)
// against the ids llama.cpp produces for each of their test texts: NAME.gguf.inp holds the texts
// separated by "\n__ggml_vocab_test__\n", NAME.gguf.out one line of ids per text (no bos/eos added,
// control tokens not parsed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include "generate.hpp"
#include "gguf/gguf_reader.hpp"
#include "model_spec.hpp"
#include "strata/engine.hpp"
#include "tokenizer/tokenizer.hpp"

namespace strata::tok {
namespace {

namespace fs = std::filesystem;

fs::path vocab_dir() { return fs::path(STRATA_REALDATA_DIR) / "vocab"; }

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + p.string());
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<std::string> read_texts(const fs::path& p) {
    const std::string all = read_file(p), sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> texts;
    for (size_t pos = 0; pos < all.size();) {
        const size_t next = all.find(sep, pos);
        if (next == std::string::npos) {
            texts.push_back(all.substr(pos));
            break;
        }
        texts.push_back(all.substr(pos, next - pos));
        pos = next + sep.size();
    }
    return texts;
}

std::vector<std::vector<int32_t>> read_ids(const fs::path& p) {
    std::vector<std::vector<int32_t>> out;
    std::istringstream lines(read_file(p));
    for (std::string line; std::getline(lines, line);) {
        std::istringstream words(line);
        std::vector<int32_t>& ids = out.emplace_back();
        for (int32_t id; words >> id;) ids.push_back(id);
    }
    return out;
}

// The vocabularies present: ggml-vocab-NAME.gguf with its .inp and .out, sorted by name.
std::vector<std::string> vocab_names() {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(vocab_dir(), ec)) {
        const std::string f = e.path().filename().string();
        if (!f.starts_with("ggml-vocab-") || !f.ends_with(".gguf")) continue;
        if (!fs::exists(e.path().string() + ".inp") || !fs::exists(e.path().string() + ".out")) continue;
        names.push_back(f.substr(11, f.size() - 16));
    }
    std::sort(names.begin(), names.end());
    return names;
}

// A missing folder fails in CI (CI=true), where the data must be present, and skips elsewhere.
TEST(RealdataVocab, FolderHasVocabularies) {
    if (!vocab_names().empty()) return;
    const char* ci = std::getenv("CI");
    if (ci && std::string(ci) == "true")
        FAIL() << "no vocabularies in " << vocab_dir() << " (set STRATA_REALDATA_DIR at configure time)";
    GTEST_SKIP() << "no vocabularies in " << vocab_dir();
}

class RealVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(RealVocab, MatchesLlamaCppIds) {
    const fs::path gguf = vocab_dir() / fmt::format("ggml-vocab-{}.gguf", GetParam());
    const tokenizer t = tokenizer::from_gguf(gguf::reader::open(gguf.string()));
    const std::vector<std::string> texts = read_texts(gguf.string() + ".inp");
    const std::vector<std::vector<int32_t>> expected = read_ids(gguf.string() + ".out");
    ASSERT_EQ(texts.size(), expected.size()) << "texts in the .inp file vs lines in the .out file";
    size_t matched = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        const std::vector<int32_t> got = t.encode(texts[i], {.add_special = false, .parse_special = false});
        if (got == expected[i]) {
            ++matched;
            continue;
        }
        ADD_FAILURE() << fmt::format("text {} ({:?}):\n  expected [{}]\n  got      [{}]", i, texts[i],
                                     fmt::join(expected[i], " "), fmt::join(got, " "));
    }
    RecordProperty("matched", static_cast<int>(matched));
    RecordProperty("texts", static_cast<int>(texts.size()));
    std::printf("%s: %zu of %zu texts as llama.cpp tokenizes them (pre-tokenizer %s)\n", GetParam().c_str(), matched,
                texts.size(), std::string(t.pre_name()).c_str());
}

// strata-make-model --vocab-from: a generated model carries the real vocabulary and tokenizes as it.
TEST_P(RealVocab, GeneratedModelCarriesTheVocabulary) {
    const fs::path gguf = vocab_dir() / fmt::format("ggml-vocab-{}.gguf", GetParam());
    make_model::model_spec spec = make_model::preset("tiny");
    spec.vocab_from = gguf.string();
    spec.tie_embeddings = true;  // a real vocabulary's embedding rows, written once and unquantized: quick
    spec.type_embd = formats::ggml_type::F16;
    const gguf::reader made = gguf::reader::from_bytes(make_model::build_model(spec).write_to_memory());
    const gguf::reader vocab_file = gguf::reader::open(gguf.string());
    const tokenizer real = tokenizer::from_gguf(vocab_file), copied = tokenizer::from_gguf(made);
    EXPECT_EQ(copied.n_vocab(), real.n_vocab());
    EXPECT_EQ(copied.pre_name(), real.pre_name());
    const auto embd = std::find_if(made.tensors().begin(), made.tensors().end(),
                                    [](const gguf::tensor_info& t) { return t.name == "token_embd.weight"; });
    ASSERT_NE(embd, made.tensors().end());
    EXPECT_EQ(embd->ne[1], real.n_vocab());
    const std::vector<std::string> texts = read_texts(gguf.string() + ".inp");
    const std::vector<std::vector<int32_t>> expected = read_ids(gguf.string() + ".out");
    for (size_t i = 0; i < texts.size(); ++i)
        EXPECT_EQ(copied.encode(texts[i], {.add_special = false}), expected[i]) << "text " << i;
}

INSTANTIATE_TEST_SUITE_P(Realdata, RealVocab, ::testing::ValuesIn(vocab_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                             std::string n = p.param;
                             std::replace_if(n.begin(), n.end(), [](char c) { return !std::isalnum(c); }, '_');
                             return n;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RealVocab);

// The engine loads a generated model with a real vocabulary, and --override-pre replaces its
// pre-tokenizer (gpt2 keeps a run of digits together, deepseek-coder cuts every digit apart).
TEST(RealdataVocab, EngineLoadsGeneratedModelAndOverridesPre) {
    const fs::path gguf = vocab_dir() / "ggml-vocab-gpt-2.gguf";
    if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " is missing (RealdataVocab.FolderHasVocabularies says why)";
    make_model::model_spec spec = make_model::preset("tiny");
    spec.vocab_from = gguf.string();
    spec.tie_embeddings = true;  // a real vocabulary's embedding rows, written once and unquantized: quick
    spec.type_embd = formats::ggml_type::F16;
    const fs::path path = fs::temp_directory_path() / "strata_realdata_gpt2.gguf";
    make_model::build_model(spec).write_file(path.string());
    model_options o;
    o.path = path.string();
    o.numa_pool = "off";
    const auto m = model::load(o);
    EXPECT_LT(m->tokenize("12345", false).size(), 5u);
    o.override_pre = "deepseek-coder";
    EXPECT_EQ(model::load(o)->tokenize("12345", false).size(), 5u);
    o.override_pre = "no-such-pre";
    EXPECT_THROW(model::load(o), std::runtime_error);
    fs::remove(path);
}

}  // namespace
}  // namespace strata::tok
