// Reading a PCI device's NUMA node from a captured sysfs tree (engine/gpu/device.hpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gpu/device.hpp"

namespace strata::engine::gpu {
namespace {

namespace fs = std::filesystem;

class DeviceSysfs : public ::testing::Test {
protected:
    void SetUp() override {
        // A tree per process and test: ctest runs the tests as separate processes, several at once.
        root_ = fs::temp_directory_path() / ("strata_sysfs_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(root_ / "bus/pci/devices/0000:65:00.0");
        fs::create_directories(root_ / "bus/pci/devices/0000:17:00.0");
        std::ofstream(root_ / "bus/pci/devices/0000:65:00.0/numa_node") << "1\n";
        std::ofstream(root_ / "bus/pci/devices/0000:17:00.0/numa_node") << "-1\n";
    }
    void TearDown() override { fs::remove_all(root_); }
    fs::path root_;
};

TEST_F(DeviceSysfs, ReadsTheNodeInEitherSpelling) {
    EXPECT_EQ(pci_numa_node("0000:65:00.0", root_.string()), 1);
    EXPECT_EQ(pci_numa_node("00000000:65:00.0", root_.string()), 1);  // NVML's 8-digit domain
    EXPECT_EQ(pci_numa_node("0000:65:00.0", root_.string()), 1);
    EXPECT_EQ(sysfs_bus_id("00000000:AB:00.0"), "0000:ab:00.0");
}

TEST_F(DeviceSysfs, UnknownIsMinusOne) {
    EXPECT_EQ(pci_numa_node("0000:17:00.0", root_.string()), -1);  // a one-node machine says -1
    EXPECT_EQ(pci_numa_node("0000:99:00.0", root_.string()), -1);  // no such device
}

}  // namespace
}  // namespace strata::engine::gpu
