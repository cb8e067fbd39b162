// Dequantising matvec per weight format, a batched variant over resident experts, and
// dequantise-to-f16 for the cuBLAS prompt path.
//
// One warp per weight row (kRowsPerBlock rows per thread block). Each pass of the warp over the row
// covers 256 elements: lane l dequantises one group of 8 adjacent elements (dequant.cuh) and multiplies
// them with the matching activations of up to kTok tokens at once, so a weight row is read once per
// kTok tokens. Passes are unrolled so that several blocks' loads are in flight. Sums are f32 and
// reduced across the warp at the end.
#include <cstdint>

#include "cuda_kernels.hpp"
#include "dequant.cuh"

namespace strata::kernels::cuda {

namespace {

using namespace detail;

constexpr int kRowsPerBlock = 4;
constexpr int kTok = 8;  // tokens per pass over a weight row

// The 8 activations at p: two 16-byte loads when p is 16-byte aligned (Vec), else eight.
template <bool Vec>
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
    if constexpr (Vec) {
        const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        for (int j = 0; j < 8; ++j) v[j] = p[j];
    }
}

// Token t's activations: x + t * x_stride, or a gathered row.
struct strided_rows {
    const float* x;
    int64_t stride;
    __device__ const float* operator()(int t) const { return x + t * stride; }
};
struct gathered_rows {
    const float* x;
    int64_t stride;
    const int32_t* row;
    __device__ const float* operator()(int t) const { return x + row[t] * stride; }
};

// sum[t] = row . x_t for t < n_tok (n_tok <= kTok), reduced over the warp (every lane holds it).
template <class F, bool Vec, class Rows>
__device__ void row_dot(const uint8_t* row, int64_t n_cols, Rows xrow, int n_tok, float (&sum)[kTok]) {
    constexpr int kGroups = F::qk / 8;            // groups of 8 per block
    constexpr int kBlocks = kWarp / kGroups;      // blocks per pass of the warp
    static_assert(kGroups * kBlocks == kWarp, "a block's groups must divide the warp");
    const int lane = threadIdx.x, g = lane % kGroups;
    const auto* blocks = reinterpret_cast<const typename F::block*>(row);
    const int64_t n_blocks = n_cols / F::qk;
#pragma unroll
    for (int t = 0; t < kTok; ++t) sum[t] = 0.0f;
#pragma unroll 2
    for (int64_t ib = lane / kGroups; ib < n_blocks; ib += kBlocks) {
        float w[8];
        F::group(blocks[ib], g, w);
        const int64_t col = ib * F::qk + 8 * g;
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
            if (t >= n_tok) break;
            float xv[8];
            load8<Vec>(xrow(t) + col, xv);
#pragma unroll
            for (int j = 0; j < 8; ++j) sum[t] += w[j] * xv[j];
        }
    }
#pragma unroll
    for (int t = 0; t < kTok; ++t) sum[t] = warp_sum(sum[t]);
}

template <class F, bool Vec>
__global__ void matvec_kernel(const uint8_t* w, size_t row_stride, int64_t n_rows, int64_t n_cols, const float* x,
                              int64_t x_stride, int n_tok, float* y, int64_t y_stride) {
    const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.y;
    if (r >= n_rows) return;
    for (int t0 = 0; t0 < n_tok; t0 += kTok) {
        float sum[kTok];
        const int n = min(kTok, n_tok - t0);
        row_dot<F, Vec>(w + r * row_stride, n_cols, strided_rows{x + t0 * x_stride, x_stride}, n, sum);
        if (threadIdx.x == 0)
            for (int t = 0; t < n; ++t) y[(t0 + t) * y_stride + r] = sum[t];
    }
}

template <class F>
__global__ void matvec_batched_kernel(int64_t n_rows, int64_t n_cols, size_t row_stride, const matvec_job* jobs) {
    const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.y;
    if (r >= n_rows) return;
    const matvec_job job = jobs[blockIdx.y];
    const uint8_t* row = static_cast<const uint8_t*>(job.w) + r * row_stride;
    float sum[kTok];
    if (reinterpret_cast<uintptr_t>(job.x) % 16 == 0)  // the same for the whole warp
        row_dot<F, true>(row, n_cols, strided_rows{job.x, 0}, 1, sum);
    else
        row_dot<F, false>(row, n_cols, strided_rows{job.x, 0}, 1, sum);
    if (threadIdx.x == 0) job.y[r] = sum[0];
}

template <class F>
__global__ void matvec_gathered_kernel(int64_t n_rows, int64_t n_cols, size_t row_stride, int64_t x_stride,
                                       int64_t y_stride, const matvec_gather_job* jobs) {
    const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.y;
    if (r >= n_rows) return;
    const matvec_gather_job& job = jobs[blockIdx.y];
    const int n = job.n_tok;
    const uint8_t* row = static_cast<const uint8_t*>(job.w) + r * row_stride;
    const gathered_rows rows{job.x, x_stride, job.x_row};
    float sum[kTok];
    if (reinterpret_cast<uintptr_t>(job.x) % 16 == 0 && x_stride % 4 == 0)  // the same for the whole block
        row_dot<F, true>(row, n_cols, rows, n, sum);
    else
        row_dot<F, false>(row, n_cols, rows, n, sum);
    if (threadIdx.x == 0)
        for (int t = 0; t < n; ++t) job.y[job.y_row[t] * y_stride + r] = sum[t];
}

// One thread per (row, block): writes the block's qk elements as halves.
template <class F>
__global__ void dequantize_kernel(const uint8_t* w, size_t row_stride, int64_t n_rows, int64_t n_cols,
                                  uint16_t* out) {
    const int64_t n_blocks = n_cols / F::qk;
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i >= n_rows * n_blocks) return;
    const int64_t r = i / n_blocks, ib = i % n_blocks;
    const auto& b = reinterpret_cast<const typename F::block*>(w + r * row_stride)[ib];
    uint16_t* dst = out + r * n_cols + ib * F::qk;
    for (int g = 0; g < F::qk / 8; ++g) {
        float w[8];
        F::group(b, g, w);
        for (int j = 0; j < 8; ++j) dst[8 * g + j] = float_to_half(w[j]);
    }
}

template <class F>
void launch_matvec(const weight_view& w, const float* x, int64_t x_stride, int n_tok, float* y, int64_t y_stride,
                   cudaStream_t s) {
    const dim3 block(kWarp, kRowsPerBlock), grid(grid_for(w.n_rows, kRowsPerBlock));
    const auto* data = static_cast<const uint8_t*>(w.data);
    if (reinterpret_cast<uintptr_t>(x) % 16 == 0 && x_stride % 4 == 0)
        STRATA_LAUNCH((matvec_kernel<F, true>), grid, block, s)(data, w.row_stride, w.n_rows, w.n_cols, x, x_stride,
                                                               n_tok, y, y_stride);
    else
        STRATA_LAUNCH((matvec_kernel<F, false>), grid, block, s)(data, w.row_stride, w.n_rows, w.n_cols, x, x_stride,
                                                                n_tok, y, y_stride);
}

template <class F>
void launch_matvec_batched(int64_t n_rows, int64_t n_cols, size_t row_stride, const matvec_job* jobs, int n_jobs,
                           cudaStream_t s) {
    const dim3 grid(grid_for(n_rows, kRowsPerBlock), static_cast<unsigned>(n_jobs));
    STRATA_LAUNCH(matvec_batched_kernel<F>, grid, dim3(kWarp, kRowsPerBlock), s)(n_rows, n_cols, row_stride, jobs);
}

template <class F>
void launch_matvec_gathered(int64_t n_rows, int64_t n_cols, size_t row_stride, int64_t x_stride, int64_t y_stride,
                            const matvec_gather_job* jobs, int n_jobs, cudaStream_t s) {
    const dim3 grid(grid_for(n_rows, kRowsPerBlock), static_cast<unsigned>(n_jobs));
    STRATA_LAUNCH(matvec_gathered_kernel<F>, grid, dim3(kWarp, kRowsPerBlock), s)(n_rows, n_cols, row_stride,
                                                                                 x_stride, y_stride, jobs);
}

template <class F>
void launch_dequantize(const weight_view& w, uint16_t* out, cudaStream_t s) {
    const int64_t n = w.n_rows * (w.n_cols / F::qk);
    STRATA_LAUNCH(dequantize_kernel<F>, grid_for(n, 256), 256, s)(static_cast<const uint8_t*>(w.data), w.row_stride,
                                                          w.n_rows, w.n_cols, out);
}

__global__ void convert_kernel(const float* x, int64_t n, uint16_t* out) {
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i < n) out[i] = float_to_half(x[i]);
}

// The one dispatch point from a ggml type to its traits; fn is called with a value of the traits type.
template <class Fn>
void dispatch(ggml_type type, const char* what, Fn&& fn) {
    switch (type) {
        case ggml_type::F32: return fn(fmt_f32{});
        case ggml_type::F16: return fn(fmt_f16{});
        case ggml_type::BF16: return fn(fmt_bf16{});
        case ggml_type::Q4_0: return fn(fmt_q4_0{});
        case ggml_type::Q8_0: return fn(fmt_q8_0{});
        case ggml_type::Q4_K: return fn(fmt_q4_k{});
        case ggml_type::Q5_K: return fn(fmt_q5_k{});
        case ggml_type::Q6_K: return fn(fmt_q6_k{});
        case ggml_type::IQ4_XS: return fn(fmt_iq4_xs{});
        case ggml_type::IQ1_S: return fn(fmt_iq1_s{});
        case ggml_type::IQ1_M: return fn(fmt_iq1_m{});
        case ggml_type::IQ2_XXS: return fn(fmt_iq2_xxs{});
        case ggml_type::IQ2_XS: return fn(fmt_iq2_xs{});
        case ggml_type::IQ2_S: return fn(fmt_iq2_s{});
        case ggml_type::IQ3_XXS: return fn(fmt_iq3_xxs{});
        case ggml_type::IQ3_S: return fn(fmt_iq3_s{});
        case ggml_type::MXFP4: return fn(fmt_mxfp4{});
        default: break;
    }
    throw std::invalid_argument(std::string(what) + ": no CUDA kernel for weight type " +
                                std::string(formats::info(type).name) + " (valid: " + matvec_types() + ")");
}

// Explicit instantiations, one line per format (dispatch() above is the only caller).
#define STRATA_CUDA_MATVEC_FORMAT(F)                                                                              \
    template void launch_matvec<F>(const weight_view&, const float*, int64_t, int, float*, int64_t, cudaStream_t); \
    template void launch_matvec_batched<F>(int64_t, int64_t, size_t, const matvec_job*, int, cudaStream_t);       \
    template void launch_matvec_gathered<F>(int64_t, int64_t, size_t, int64_t, int64_t, const matvec_gather_job*,  \
                                            int, cudaStream_t);                                                    \
    template void launch_dequantize<F>(const weight_view&, uint16_t*, cudaStream_t);
STRATA_CUDA_MATVEC_FORMAT(fmt_f32)
STRATA_CUDA_MATVEC_FORMAT(fmt_f16)
STRATA_CUDA_MATVEC_FORMAT(fmt_bf16)
STRATA_CUDA_MATVEC_FORMAT(fmt_q4_0)
STRATA_CUDA_MATVEC_FORMAT(fmt_q8_0)
STRATA_CUDA_MATVEC_FORMAT(fmt_q4_k)
STRATA_CUDA_MATVEC_FORMAT(fmt_q5_k)
STRATA_CUDA_MATVEC_FORMAT(fmt_q6_k)
STRATA_CUDA_MATVEC_FORMAT(fmt_iq4_xs)
STRATA_CUDA_MATVEC_FORMAT(fmt_iq1_s)
STRATA_CUDA_MATVEC_FORMAT(fmt_iq1_m)
STRATA_CUDA_MATVEC_FORMAT(fmt_iq2_xxs)
STRATA_CUDA_MATVEC_FORMAT(fmt_iq2_xs)
STRATA_CUDA_MATVEC_FORMAT(fmt_iq2_s)
STRATA_CUDA_MATVEC_FORMAT(fmt_iq3_xxs)
STRATA_CUDA_MATVEC_FORMAT(fmt_iq3_s)
STRATA_CUDA_MATVEC_FORMAT(fmt_mxfp4)
#undef STRATA_CUDA_MATVEC_FORMAT

}  // namespace

bool has_matvec(ggml_type type) {
    switch (type) {
        case ggml_type::F32: case ggml_type::F16: case ggml_type::BF16: case ggml_type::Q4_0: case ggml_type::Q8_0:
        case ggml_type::Q4_K: case ggml_type::Q5_K: case ggml_type::Q6_K: case ggml_type::IQ4_XS:
        case ggml_type::IQ1_S: case ggml_type::IQ1_M: case ggml_type::IQ2_XXS: case ggml_type::IQ2_XS:
        case ggml_type::IQ2_S: case ggml_type::IQ3_XXS: case ggml_type::IQ3_S: case ggml_type::MXFP4: return true;
        default: return false;
    }
}

const char* matvec_types() {
    return "F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, "
           "IQ3_S, MXFP4";
}

// A row must be whole blocks (the float formats are read 32 elements at a time).
template <class F>
void check_cols(int64_t n_cols, const char* what) {
    if (n_cols % F::qk != 0)
        throw std::invalid_argument(std::string(what) + ": rows of " + std::to_string(n_cols) +
                                    " elements are not a multiple of " + std::to_string(F::qk));
}

void matvec(const weight_view& w, const float* x, int64_t x_stride, int n_tok, float* y, int64_t y_stride,
            stream_t stream) {
    if (n_tok <= 0 || w.n_rows <= 0) return;
    dispatch(w.type, "matvec", [&](auto fmt) {
        check_cols<decltype(fmt)>(w.n_cols, "matvec");
        launch_matvec<decltype(fmt)>(w, x, x_stride, n_tok, y, y_stride, as_stream(stream));
    });
    check_launch("matvec");
}

void matvec_batched(ggml_type type, int64_t n_rows, int64_t n_cols, size_t row_stride, const matvec_job* jobs,
                    int n_jobs, stream_t stream) {
    if (n_jobs <= 0) return;
    dispatch(type, "matvec_batched", [&](auto fmt) {
        check_cols<decltype(fmt)>(n_cols, "matvec_batched");
        launch_matvec_batched<decltype(fmt)>(n_rows, n_cols, row_stride, jobs, n_jobs, as_stream(stream));
    });
    check_launch("matvec_batched");
}

void matvec_gathered(ggml_type type, int64_t n_rows, int64_t n_cols, size_t row_stride, int64_t x_stride,
                     int64_t y_stride, const matvec_gather_job* jobs, int n_jobs, stream_t stream) {
    if (n_jobs <= 0) return;
    dispatch(type, "matvec_gathered", [&](auto fmt) {
        check_cols<decltype(fmt)>(n_cols, "matvec_gathered");
        launch_matvec_gathered<decltype(fmt)>(n_rows, n_cols, row_stride, x_stride, y_stride, jobs, n_jobs,
                                              as_stream(stream));
    });
    check_launch("matvec_gathered");
}

void dequantize_f16(const weight_view& w, uint16_t* out, stream_t stream) {
    dispatch(w.type, "dequantize_f16", [&](auto fmt) {
        check_cols<decltype(fmt)>(w.n_cols, "dequantize_f16");
        launch_dequantize<decltype(fmt)>(w, out, as_stream(stream));
    });
    check_launch("dequantize_f16");
}

void convert_f32_to_f16(const float* x, int64_t n, uint16_t* out, stream_t stream) {
    if (n <= 0) return;
    STRATA_LAUNCH(convert_kernel, grid_for(n, 256), 256, as_stream(stream))(x, n, out);
    check_launch("convert_f32_to_f16");
}

}  // namespace strata::kernels::cuda
