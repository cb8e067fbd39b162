// strata-bench gpu-kernels: the CUDA kernels' speed on the device. Per weight format, the matvec at 1
// and 8 tokens over one large matrix and the batched matvec over expert-shaped jobs (the hybrid's
// resident experts), in GB/s of weights read next to a device-to-device copy of the same bytes in the
// same run; then the cost of one small launch and of a launch + host round trip, which bound a decode
// step made of many small kernels. Medians over the repeats.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "modes.hpp"

#ifdef STRATA_HAVE_CUDA
#include "cuda_kernels.hpp"
#include "formats/quant.hpp"
#include "formats/types.hpp"
#include "gpu/cuda_raii.hpp"
#endif

namespace {

#ifdef STRATA_HAVE_CUDA

namespace cu = strata::kernels::cuda;
namespace eg = strata::engine::gpu;
using strata::formats::ggml_type;

// Median milliseconds of `reps` timed calls of f on stream s (after two untimed ones).
template <class F>
double median_ms(cudaStream_t s, int reps, F&& f) {
    f();
    f();
    const eg::event a = eg::event::create(true), b = eg::event::create(true);
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        a.record(s);
        f();
        b.record(s);
        b.synchronize();
        t.push_back(b.ms_since(a));
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// n_rows rows of `type`: a few distinct quantised rows repeated (the values do not change the speed,
// and quantising a large matrix with the code-book searches would take minutes).
eg::device_buffer<uint8_t> tiled_rows(ggml_type type, int64_t n_rows, int64_t n_cols, size_t row_size) {
    constexpr int kDistinct = 16;
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 0.05f);
    std::vector<float> src(static_cast<size_t>(n_cols));
    std::vector<uint8_t> rows(row_size * kDistinct);
    for (int r = 0; r < kDistinct; ++r) {
        for (float& x : src) x = dist(rng);
        strata::formats::quantize_row(type, src.data(), rows.data() + r * row_size, n_cols);
    }
    std::vector<uint8_t> host(row_size * static_cast<size_t>(n_rows));
    for (int64_t r = 0; r < n_rows; ++r)
        std::memcpy(host.data() + static_cast<size_t>(r) * row_size, rows.data() + (r % kDistinct) * row_size, row_size);
    eg::device_buffer<uint8_t> d(host.size());
    eg::check(cudaMemcpy(d.data(), host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    return d;
}

eg::device_buffer<float> random_device(size_t n) {
    std::mt19937 rng(2);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> h(n);
    for (float& x : h) x = dist(rng);
    eg::device_buffer<float> d(n);
    eg::check(cudaMemcpy(d.data(), h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    return d;
}

int run(int argc, char** argv) {
    cxxopts::Options opts("strata-bench gpu-kernels", "CUDA kernels' speed on the device");
    opts.add_options()
        ("formats", "comma list of weight formats (default: every format with a CUDA matvec)", cxxopts::value<std::string>()->default_value(""))
        ("mib", "MiB of weights per matvec matrix", cxxopts::value<int>()->default_value("512"))
        ("cols", "columns of the matvec matrix (the model width)", cxxopts::value<int64_t>()->default_value("4096"))
        ("expert", "expert shape ROWSxCOLS for the batched matvec", cxxopts::value<std::string>()->default_value("768x2048"))
        ("experts", "distinct experts the batched jobs read", cxxopts::value<int>()->default_value("128"))
        ("r,repeats", "timed calls per figure", cxxopts::value<int>()->default_value("20"))
        ("gpu", "CUDA device", cxxopts::value<int>()->default_value("0"))
        ("h,help", "this help");
    const auto a = opts.parse(argc, argv);
    if (a.count("help")) {
        std::puts(opts.help().c_str());
        return 0;
    }
    eg::check(cudaSetDevice(a["gpu"].as<int>()), "cudaSetDevice");
    cudaDeviceProp prop{};
    eg::check(cudaGetDeviceProperties(&prop, a["gpu"].as<int>()), "cudaGetDeviceProperties");
    const int reps = std::max(3, a["repeats"].as<int>());
    const size_t bytes = static_cast<size_t>(a["mib"].as<int>()) << 20;
    const int64_t n_cols = a["cols"].as<int64_t>();
    int64_t e_rows = 0, e_cols = 0;
    if (std::sscanf(a["expert"].as<std::string>().c_str(), "%ldx%ld", &e_rows, &e_cols) != 2 || e_rows <= 0 ||
        e_cols <= 0) {
        std::fprintf(stderr, "--expert '%s' must be ROWSxCOLS\n", a["expert"].as<std::string>().c_str());
        return 2;
    }
    const int n_experts = std::max(1, a["experts"].as<int>());

    std::vector<ggml_type> types;
    const std::string list = a["formats"].as<std::string>();
    if (list.empty()) {
        for (int t = 0; t < 64; ++t)
            if (const auto* ti = strata::formats::find_type(static_cast<uint32_t>(t)); ti && cu::has_matvec(ti->type))
                types.push_back(ti->type);
    } else {
        for (const std::string& name : strata::bench::split_list(list)) {
            const auto t = strata::formats::type_from_name(name);
            if (!t || !cu::has_matvec(*t)) {
                std::fprintf(stderr, "--formats: '%s' has no CUDA matvec (those that do: %s)\n", name.c_str(),
                             cu::matvec_types());
                return 2;
            }
            types.push_back(*t);
        }
    }

    const eg::stream st = eg::stream::create();
    cudaStream_t s = st.get();

    // Baseline: a device-to-device copy of the matrix size reads and writes each byte once.
    double copy_gbs = 0;
    {
        eg::device_buffer<uint8_t> src(bytes), dst(bytes);
        eg::check(cudaMemsetAsync(src.data(), 1, bytes, s), "cudaMemsetAsync");
        const double ms = median_ms(s, reps, [&] {
            eg::check(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
        });
        copy_gbs = 2.0 * double(bytes) / (ms * 1e6);
    }
    std::printf("device %s: %d SMs, %.0f MiB; device-to-device copy of %zu MiB: %.0f GB/s (read + written)\n\n",
                prop.name, prop.multiProcessorCount, double(prop.totalGlobalMem) / (1 << 20), bytes >> 20, copy_gbs);
    std::printf("| format | matvec 1 tok GB/s | matvec 8 tok GB/s | %% of copy (1 tok) | batched %ldx%ld, 8 jobs GB/s | "
                "64 jobs GB/s | %% of copy (64 jobs) |\n|---|---|---|---|---|---|---|\n",
                e_rows, e_cols);

    for (const ggml_type type : types) {
        const size_t row_size = strata::formats::row_size(type, n_cols);
        const int64_t n_rows = static_cast<int64_t>(bytes / row_size);
        const eg::device_buffer<uint8_t> w = tiled_rows(type, n_rows, n_cols, row_size);
        const eg::device_buffer<float> x = random_device(8 * static_cast<size_t>(n_cols));
        eg::device_buffer<float> y(8 * static_cast<size_t>(n_rows));
        const cu::weight_view v{type, w.data(), n_rows, n_cols, row_size};
        const double wbytes = double(row_size) * double(n_rows);
        double gbs[2];
        const int toks[2] = {1, 8};
        for (int i = 0; i < 2; ++i) {
            const double ms = median_ms(s, reps, [&] { cu::matvec(v, x.data(), n_cols, toks[i], y.data(), n_rows, s); });
            gbs[i] = wbytes / (ms * 1e6);
        }

        // Batched: jobs over distinct experts (one token each), as the hybrid's resident experts run.
        const size_t e_row = strata::formats::row_size(type, e_cols), e_bytes = e_row * static_cast<size_t>(e_rows);
        const eg::device_buffer<uint8_t> ew = tiled_rows(type, e_rows * n_experts, e_cols, e_row);
        const eg::device_buffer<float> ex = random_device(64 * static_cast<size_t>(e_cols));
        eg::device_buffer<float> ey(64 * static_cast<size_t>(e_rows));
        double bgbs[2];
        const int n_jobs[2] = {8, 64};
        for (int i = 0; i < 2; ++i) {
            std::vector<cu::matvec_job> jobs(static_cast<size_t>(n_jobs[i]));
            for (int j = 0; j < n_jobs[i]; ++j)
                jobs[static_cast<size_t>(j)] = {ew.data() + static_cast<size_t>((j * 7) % n_experts) * e_bytes,
                                                ex.data() + static_cast<size_t>(j) * e_cols,
                                                ey.data() + static_cast<size_t>(j) * e_rows};
            eg::device_buffer<cu::matvec_job> dj(jobs.size());
            eg::check(cudaMemcpy(dj.data(), jobs.data(), jobs.size() * sizeof(cu::matvec_job), cudaMemcpyHostToDevice),
                      "cudaMemcpy");
            const double ms = median_ms(s, reps, [&] {
                cu::matvec_batched(type, e_rows, e_cols, e_row, dj.data(), n_jobs[i], s);
            });
            const int distinct = std::min(n_jobs[i], n_experts);
            bgbs[i] = double(e_bytes) * distinct / (ms * 1e6);
        }
        std::printf("| %s | %.0f | %.0f | %.0f %% | %.0f | %.0f | %.0f %% |\n", std::string(strata::formats::info(type).name).c_str(), gbs[0],
                    gbs[1], 100.0 * gbs[0] / (copy_gbs / 2), bgbs[0], bgbs[1], 100.0 * bgbs[1] / (copy_gbs / 2));
        std::fflush(stdout);
    }
    std::printf("\n%% of copy: against the copy's read rate (half its read + written figure). The batched jobs "
                "read distinct experts (job j: expert 7j mod %d), one token each.\n", n_experts);

    // A decode step is many small kernels: what one costs queued back to back, and with a host wait.
    {
        eg::device_buffer<float> a1(256), b1(256);
        eg::check(cudaMemsetAsync(a1.data(), 0, 1024, s), "cudaMemsetAsync");
        eg::check(cudaMemsetAsync(b1.data(), 0, 1024, s), "cudaMemsetAsync");
        constexpr int kLaunches = 1000;
        const double queued = median_ms(s, 5, [&] {
            for (int i = 0; i < kLaunches; ++i) cu::add(a1.data(), b1.data(), 256, s);
        });
        const eg::event e = eg::event::create();
        std::vector<double> t;
        for (int i = 0; i < 200; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            cu::add(a1.data(), b1.data(), 256, s);
            e.record(s);
            e.synchronize();
            t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(t.begin(), t.end());
        std::printf("small kernel (add of 256 floats): %.2f us each when %d are queued back to back; launch + "
                    "event wait on the host: %.1f us (median of 200)\n",
                    1000.0 * queued / kLaunches, kLaunches, t[t.size() / 2]);
    }
    return 0;
}

#else

int run(int, char**) {
    std::fputs("strata-bench gpu-kernels: this build has no CUDA backend (configure with -DSTRATA_CUDA=ON)\n", stderr);
    return 1;
}

#endif

const strata::bench::register_mode registered{
    {"gpu-kernels", "CUDA kernels: matvec and batched expert GB/s per format vs a device copy; launch costs", run}};

}  // namespace
