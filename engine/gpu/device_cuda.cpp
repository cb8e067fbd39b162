// select_device() with the CUDA runtime.
#include <cuda_runtime_api.h>
#include <spdlog/fmt/fmt.h>

#include "gpu/device.hpp"

namespace strata::engine::gpu {

std::optional<device_info> select_device(int index, std::string* why) {
    auto fail = [&](std::string reason) -> std::optional<device_info> {
        if (why) *why = std::move(reason);
        return std::nullopt;
    };
    int count = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess)
        return fail(fmt::format("no usable CUDA device: cudaGetDeviceCount failed ({})", cudaGetErrorString(e)));
    if (count == 0) return fail("no CUDA device is present");
    if (index < 0 || index >= count)
        return fail(fmt::format("--gpu {} is out of range: {} CUDA device{} present (0..{})", index, count,
                                count == 1 ? " is" : "s are", count - 1));
    if (const cudaError_t e = cudaSetDevice(index); e != cudaSuccess)
        return fail(fmt::format("CUDA device {} cannot be used: {}", index, cudaGetErrorString(e)));
    cudaDeviceProp prop{};
    if (const cudaError_t e = cudaGetDeviceProperties(&prop, index); e != cudaSuccess)
        return fail(fmt::format("CUDA device {} does not answer: {}", index, cudaGetErrorString(e)));
    device_info d;
    d.index = index;
    d.name = prop.name;
    d.compute_major = prop.major;
    d.compute_minor = prop.minor;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, index) == cudaSuccess) d.pci_bus_id = sysfs_bus_id(bus);
    size_t free_b = 0, total_b = 0;
    if (const cudaError_t e = cudaMemGetInfo(&free_b, &total_b); e != cudaSuccess)
        return fail(fmt::format("CUDA device {} cannot report its memory: {}", index, cudaGetErrorString(e)));
    d.free_bytes = free_b;
    d.total_bytes = total_b;
    d.numa_node = d.pci_bus_id.empty() ? -1 : pci_numa_node(d.pci_bus_id);
    return d;
}

}  // namespace strata::engine::gpu
