#include "formats/types.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <stdexcept>
#include <string>

namespace strata::formats {

namespace {

constexpr int64_t QK_K = 256;

// name, block size, bytes per block, quantized, supported by strata
constexpr std::array kTypes = {
    type_info{ggml_type::F32, "F32", 1, 4, false, true},
    type_info{ggml_type::F16, "F16", 1, 2, false, true},
    type_info{ggml_type::Q4_0, "Q4_0", 32, 18, true, true},
    type_info{ggml_type::Q4_1, "Q4_1", 32, 20, true, true},
    type_info{ggml_type::Q5_0, "Q5_0", 32, 22, true, true},
    type_info{ggml_type::Q5_1, "Q5_1", 32, 24, true, true},
    type_info{ggml_type::Q8_0, "Q8_0", 32, 34, true, true},
    type_info{ggml_type::Q8_1, "Q8_1", 32, 36, true, false},
    type_info{ggml_type::Q2_K, "Q2_K", QK_K, 84, true, true},
    type_info{ggml_type::Q3_K, "Q3_K", QK_K, 110, true, true},
    type_info{ggml_type::Q4_K, "Q4_K", QK_K, 144, true, true},
    type_info{ggml_type::Q5_K, "Q5_K", QK_K, 176, true, true},
    type_info{ggml_type::Q6_K, "Q6_K", QK_K, 210, true, true},
    type_info{ggml_type::Q8_K, "Q8_K", QK_K, 292, true, true},
    type_info{ggml_type::IQ2_XXS, "IQ2_XXS", QK_K, 66, true, true},
    type_info{ggml_type::IQ2_XS, "IQ2_XS", QK_K, 74, true, true},
    type_info{ggml_type::IQ3_XXS, "IQ3_XXS", QK_K, 98, true, true},
    type_info{ggml_type::IQ1_S, "IQ1_S", QK_K, 50, true, true},
    type_info{ggml_type::IQ4_NL, "IQ4_NL", 32, 18, true, true},
    type_info{ggml_type::IQ3_S, "IQ3_S", QK_K, 110, true, true},
    type_info{ggml_type::IQ2_S, "IQ2_S", QK_K, 82, true, true},
    type_info{ggml_type::IQ4_XS, "IQ4_XS", QK_K, 136, true, true},
    type_info{ggml_type::I8, "I8", 1, 1, false, false},
    type_info{ggml_type::I16, "I16", 1, 2, false, false},
    type_info{ggml_type::I32, "I32", 1, 4, false, false},
    type_info{ggml_type::I64, "I64", 1, 8, false, false},
    type_info{ggml_type::F64, "F64", 1, 8, false, false},
    type_info{ggml_type::IQ1_M, "IQ1_M", QK_K, 56, true, true},
    type_info{ggml_type::BF16, "BF16", 1, 2, false, true},
    type_info{ggml_type::TQ1_0, "TQ1_0", QK_K, 54, true, false},
    type_info{ggml_type::TQ2_0, "TQ2_0", QK_K, 66, true, false},
    type_info{ggml_type::MXFP4, "MXFP4", 32, 17, true, true},
};

}  // namespace

const type_info* find_type(uint32_t id) {
    for (const auto& t : kTypes)
        if (static_cast<uint32_t>(t.type) == id) return &t;
    return nullptr;
}

const type_info& info(ggml_type type) {
    const type_info* t = find_type(static_cast<uint32_t>(type));
    if (!t) throw std::invalid_argument("unknown ggml type id " + std::to_string(static_cast<uint32_t>(type)));
    return *t;
}

std::optional<ggml_type> type_from_name(std::string_view name) {
    for (const auto& t : kTypes) {
        if (t.name.size() != name.size()) continue;
        if (std::equal(name.begin(), name.end(), t.name.begin(),
                       [](char a, char b) { return std::toupper(static_cast<unsigned char>(a)) == b; }))
            return t.type;
    }
    return std::nullopt;
}

size_t row_size(ggml_type type, int64_t n) {
    const type_info& t = info(type);
    if (n < 0 || n % t.block_size != 0)
        throw std::invalid_argument("a row of " + std::to_string(n) + " elements is not a whole number of " +
                                    std::string(t.name) + " blocks of " + std::to_string(t.block_size));
    return static_cast<size_t>(n / t.block_size) * t.type_size;
}

}  // namespace strata::formats
