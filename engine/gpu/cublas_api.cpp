#include "gpu/cublas_api.hpp"

#include <stdexcept>
#include <string>

#if !STRATA_CUDA_EMU
#include <dlfcn.h>
#endif

namespace strata::engine::gpu {
namespace {

#if STRATA_CUDA_EMU
// The emulator's cuBLAS is part of the program.
cublas_api load() {
    return {&::cublasCreate, &::cublasDestroy, &::cublasSetStream, &::cublasGemmEx};
}
#else
// The exported name behind cublas_v2.h's macros (cublasCreate is cublasCreate_v2).
#define STRATA_CUBLAS_NAME(f) STRATA_CUBLAS_NAME_(f)
#define STRATA_CUBLAS_NAME_(f) #f

template <class F>
void resolve(void* lib, const char* name, F& f) {
    void* p = dlsym(lib, name);
    if (p == nullptr) throw std::runtime_error(std::string("cuBLAS (") + STRATA_CUBLAS_LIBRARY + ") has no symbol " + name);
    f = reinterpret_cast<F>(p);
}

cublas_api load() {
    // The soname first (LD_LIBRARY_PATH, the loader's cache), then the toolkit this program was built with.
    void* lib = dlopen(STRATA_CUBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) lib = dlopen(STRATA_CUBLAS_TOOLKIT_PATH, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        const char* why = dlerror();
        throw std::runtime_error(std::string("cannot load cuBLAS (") + STRATA_CUBLAS_LIBRARY + ", nor " +
                                 STRATA_CUBLAS_TOOLKIT_PATH + "): " + (why != nullptr ? why : "unknown error"));
    }
    cublas_api api{};
    resolve(lib, STRATA_CUBLAS_NAME(cublasCreate), api.create);
    resolve(lib, STRATA_CUBLAS_NAME(cublasDestroy), api.destroy);
    resolve(lib, STRATA_CUBLAS_NAME(cublasSetStream), api.set_stream);
    resolve(lib, "cublasGemmEx", api.gemm_ex);
    return api;  // the library stays loaded for the life of the process
}
#endif

}  // namespace

const cublas_api& cublas_functions() {
    static const cublas_api api = load();
    return api;
}

}  // namespace strata::engine::gpu
