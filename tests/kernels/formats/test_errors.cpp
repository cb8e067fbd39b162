// Bad inputs: unsupported types and ragged rows throw std::invalid_argument naming the numbers.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/quant.hpp"

namespace strata::formats {
namespace {

// The message of the std::invalid_argument fn throws (fails the test if it throws nothing).
std::string message_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    ADD_FAILURE() << "no std::invalid_argument thrown";
    return {};
}

std::vector<float> f(1024);
std::vector<uint8_t> bytes(4096);

TEST(Errors, UnsupportedTypeNamesItAndListsTheSupported) {
    const auto msg = message_of([] { dequantize_row(ggml_type::TQ1_0, bytes.data(), f.data(), 256); });
    EXPECT_NE(msg.find("TQ1_0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("34"), std::string::npos) << msg;
    for (const char* name : {"F32", "BF16", "Q4_0", "Q5_1", "Q2_K", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ1_M", "MXFP4"})
        EXPECT_NE(msg.find(name), std::string::npos) << name << " missing from: " << msg;

    EXPECT_FALSE(can_quantize(ggml_type::TQ2_0));
    EXPECT_TRUE(can_quantize(ggml_type::Q4_K));
    EXPECT_TRUE(can_quantize(ggml_type::MXFP4));
    const auto qmsg = message_of([] { quantize_row(ggml_type::TQ2_0, f.data(), bytes.data(), 256); });
    EXPECT_NE(qmsg.find("TQ2_0"), std::string::npos) << qmsg;

    const auto umsg = message_of([] { dequantize_row(static_cast<ggml_type>(99), bytes.data(), f.data(), 32); });
    EXPECT_NE(umsg.find("99"), std::string::npos) << umsg;

    // Q8_1 is an activation format: no weight dot product.
    const auto dmsg = message_of([] { (void)vec_dot_type(ggml_type::Q8_1); });
    EXPECT_NE(dmsg.find("Q8_1"), std::string::npos) << dmsg;
    EXPECT_EQ(dmsg.find("Q8_1,"), std::string::npos) << "Q8_1 listed as supported: " << dmsg;
    message_of([] { (void)vec_dot_ref(ggml_type::I8, 32, bytes.data(), f.data()); });
}

TEST(Errors, RaggedRowNamesTheNumbers) {
    const auto msg = message_of([] { dequantize_row(ggml_type::Q4_K, bytes.data(), f.data(), 300); });
    EXPECT_NE(msg.find("300"), std::string::npos) << msg;
    EXPECT_NE(msg.find("256"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Q4_K"), std::string::npos) << msg;

    const auto qmsg = message_of([] { quantize_row(ggml_type::Q4_0, f.data(), bytes.data(), 33); });
    EXPECT_NE(qmsg.find("33"), std::string::npos) << qmsg;
    EXPECT_NE(qmsg.find("32"), std::string::npos) << qmsg;

    const auto vmsg = message_of([] { (void)vec_dot_ref(ggml_type::Q8_0, 40, bytes.data(), bytes.data()); });
    EXPECT_NE(vmsg.find("40"), std::string::npos) << vmsg;

    message_of([] { dequantize_row(ggml_type::F16, bytes.data(), f.data(), -1); });
}

}  // namespace
}  // namespace strata::formats
