// The resident-memory split the load log states (engine/process_memory): smaps parsed by kind, this
// process's own pages counted where they belong, and a CPU-only model that leaves cuBLAS unmapped.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "generate.hpp"
#include "process_memory.hpp"
#include "strata/engine.hpp"

namespace strata {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kib = 1024, mib = kib * 1024;

fs::path temp_path(const std::string& name) {
    const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
    return fs::temp_directory_path() / ("strata_pm_" + std::to_string(::getpid()) + "_" + t->name() + "_" + name);
}

TEST(ProcessMemory, SplitsSmapsIntoAnonymousTheFileAndTheProgram) {
    const fs::path model = temp_path("model.gguf");
    std::ofstream(model) << "x";
    const std::string real = fs::canonical(model).string();
    const fs::path smaps = temp_path("smaps");
    std::ofstream(smaps) << "55d0c0000000-55d0c0100000 r-xp 00000000 fd:01 1234 /usr/bin/strata-server\n"
                            "Size:               1024 kB\nRss:                 600 kB\nAnonymous:             0 kB\n"
                            "AnonHugePages:         0 kB\nVmFlags: rd ex mr mw me\n"
                            "55d0c0200000-55d0c0300000 rw-p 00100000 fd:01 1234 /usr/bin/strata-server\n"
                            "Rss:                  40 kB\nAnonymous:            24 kB\n"
                            "7f0000000000-7f0040000000 r--s 00000000 00:00 99 " + real + "\n"
                            "Rss:                2048 kB\nAnonymous:             0 kB\n"
                            "7f1000000000-7f1010000000 rw-p 00000000 00:00 0 \n"
                            "Rss:               65536 kB\nAnonymous:         65536 kB\nFilePmdMapped:         0 kB\n"
                            "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n"
                            "Rss:                 132 kB\nAnonymous:           132 kB\n";
    const auto m = engine::read_process_memory(model.string(), smaps.string());
    ASSERT_TRUE(m);
    EXPECT_EQ(m->anonymous, (24 + 65536 + 132) * kib);
    EXPECT_EQ(m->file, 2048 * kib);  // matched by path: the device in smaps is not the file's here
    EXPECT_EQ(m->program, (600 + 16) * kib);
    EXPECT_EQ(m->rss, m->anonymous + m->file + m->program);
    // Without a file to count apart, its pages are the program's.
    const auto none = engine::read_process_memory("", smaps.string());
    ASSERT_TRUE(none);
    EXPECT_EQ(none->file, 0u);
    EXPECT_EQ(none->program, (600 + 16 + 2048) * kib);
    EXPECT_FALSE(engine::read_process_memory("", temp_path("missing").string()));
    fs::remove(model);
    fs::remove(smaps);
}

TEST(ProcessMemory, CountsThisProcesssPagesWhereTheyBelong) {
    const fs::path path = temp_path("mapped");
    const size_t file_bytes = 4 * mib, anon_bytes = 16 * mib;
    {
        std::ofstream out(path, std::ios::binary);
        const std::string chunk(mib, 'a');
        for (size_t i = 0; i < file_bytes / mib; ++i) out << chunk;
    }
    const auto before = engine::read_process_memory(path.string());
    ASSERT_TRUE(before);
    EXPECT_EQ(before->file, 0u);

    std::FILE* f = std::fopen(path.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    void* mapped = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fileno(f), 0);
    ASSERT_NE(mapped, MAP_FAILED);
    volatile unsigned sum = 0;
    const long page = ::sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < file_bytes; i += static_cast<size_t>(page)) sum = sum + static_cast<const unsigned char*>(mapped)[i];
    void* anon = ::mmap(nullptr, anon_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(anon, MAP_FAILED);
    std::memset(anon, 1, anon_bytes);

    const auto after = engine::read_process_memory(path.string());
    ASSERT_TRUE(after);
    EXPECT_EQ(after->file, file_bytes);
    EXPECT_GE(after->anonymous, before->anonymous + anon_bytes);
    EXPECT_EQ(after->rss, after->anonymous + after->file + after->program);
    EXPECT_GT(after->program, 0u);  // this test binary and its libraries
    ::munmap(anon, anon_bytes);
    ::munmap(mapped, file_bytes);
    std::fclose(f);
    fs::remove(path);
}

// cuBLAS is opened only when a GPU model is made: a CPU-only run on a CUDA build never maps it.
TEST(ProcessMemory, ACpuOnlyModelLeavesCublasUnmapped) {
#if !defined(STRATA_HAVE_CUDA) || defined(STRATA_CUDA_EMU)
    GTEST_SKIP() << "needs a build against the CUDA Toolkit (the emulator's cuBLAS is linked in)";
#else
    const fs::path path = temp_path("tiny.gguf");
    make_model::build_model(make_model::preset("tiny", make_model::arch::mixtral)).write_file(path.string());
    model_options o;
    o.path = path.string();
    o.numa_pool = "off";
    o.n_ctx = 256;
    auto m = model::load(o);
    session s(m);
    const std::vector<int32_t> prompt{1, 2, 3};
    EXPECT_EQ(s.evaluate(prompt).size(), static_cast<size_t>(m->info().n_vocab));
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) EXPECT_EQ(line.find("libcublas"), std::string::npos) << line;
    fs::remove(path);
#endif
}

}  // namespace
}  // namespace strata
