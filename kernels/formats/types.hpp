// GGML tensor type ids, as stored in GGUF tensor infos, and their block geometry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata::formats {

// Ids are GGUF's on-disk values; gaps are ids ggml has retired.
enum class ggml_type : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
    IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct type_info {
    ggml_type type;
    std::string_view name;   // ggml's spelling: "Q4_K", "F16", ...
    int64_t block_size;      // elements per block
    size_t type_size;        // bytes per block
    bool quantized;
    bool supported;          // strata can dequantize it (the formats of kernels/formats)
};

// nullptr for an id ggml does not define (or has retired).
const type_info* find_type(uint32_t id);
const type_info& info(ggml_type type);
std::optional<ggml_type> type_from_name(std::string_view name);  // case-insensitive

// Bytes of a row of n elements; n must be a multiple of the block size.
size_t row_size(ggml_type type, int64_t n);

}  // namespace strata::formats
