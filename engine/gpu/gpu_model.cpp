#include "gpu/gpu_model.hpp"

#include <cstring>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

#include "formats/types.hpp"

namespace strata::engine::gpu {

namespace {

device_buffer<float> upload_floats(const float* src, int64_t n, uint64_t& bytes) {
    if (!src) return {};
    device_buffer<float> d(static_cast<size_t>(n));
    check(cudaMemcpy(d.data(), src, d.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy (norm or bias)");
    bytes += d.bytes();
    return d;
}

dev_matrix upload_matrix(const weight_matrix& w, uint64_t& bytes) {
    dev_matrix d;
    if (!w.present()) return d;
    if (!kernels::cuda::has_matvec(w.m.type))
        throw std::invalid_argument(fmt::format("{} is {}, which has no CUDA kernel (CUDA kernels take {})", w.name,
                                                formats::info(w.m.type).name, kernels::cuda::matvec_types()));
    d.type = w.m.type;
    d.n_rows = w.n_rows;
    d.n_cols = w.m.n_cols;
    d.row_stride = formats::row_size(d.type, d.n_cols);
    d.data = device_buffer<uint8_t>(d.row_stride * static_cast<size_t>(d.n_rows));
    // The file's rows may be further apart than a row (row_stride >= row size): a pitched copy.
    check(cudaMemcpy2D(d.data.data(), d.row_stride, w.m.data, w.m.row_stride, d.row_stride,
                       static_cast<size_t>(d.n_rows), cudaMemcpyHostToDevice),
          ("cudaMemcpy2D of " + w.name).c_str());
    bytes += d.data.bytes();
    return d;
}

}  // namespace

dev_model upload_dense(const hparams& hp, const model_weights& w) {
    dev_model m;
    for (const layer_weights& l : w.layers) {
        dev_layer d;
        d.attn_norm = upload_floats(l.attn_norm, hp.n_embd, m.bytes);
        d.ffn_norm = upload_floats(l.ffn_norm, hp.n_embd, m.bytes);
        d.bq = upload_floats(l.bq, hp.n_q(), m.bytes);
        d.bk = upload_floats(l.bk, hp.n_kv(), m.bytes);
        d.bv = upload_floats(l.bv, hp.n_kv(), m.bytes);
        d.q_norm = upload_floats(l.q_norm, hp.head_dim, m.bytes);
        d.k_norm = upload_floats(l.k_norm, hp.head_dim, m.bytes);
        d.shexp_gate_inp = upload_floats(l.shexp_gate_inp, hp.n_embd, m.bytes);
        d.exp_probs_b = upload_floats(l.exp_probs_b, hp.n_expert, m.bytes);
        d.wq = upload_matrix(l.wq, m.bytes);
        d.wk = upload_matrix(l.wk, m.bytes);
        d.wv = upload_matrix(l.wv, m.bytes);
        d.wo = upload_matrix(l.wo, m.bytes);
        d.router = upload_matrix(l.router, m.bytes);
        d.shexp_gate = upload_matrix(l.shexp_gate, m.bytes);
        d.shexp_up = upload_matrix(l.shexp_up, m.bytes);
        d.shexp_down = upload_matrix(l.shexp_down, m.bytes);
        d.ffn_gate = upload_matrix(l.ffn_gate, m.bytes);
        d.ffn_up = upload_matrix(l.ffn_up, m.bytes);
        d.ffn_down = upload_matrix(l.ffn_down, m.bytes);
        m.layers.push_back(std::move(d));
    }
    m.output_norm = upload_floats(w.output_norm, hp.n_embd, m.bytes);
    m.output = upload_matrix(w.output, m.bytes);
    return m;
}

slot_layout layout_slots(const std::vector<arenas::moe_layer>& layers) {
    slot_layout s;
    for (const arenas::moe_layer& l : layers) {
        for (const arenas::expert_tensor* t : {&l.gate, &l.up, &l.down})
            if (!kernels::cuda::has_matvec(t->type))
                throw std::invalid_argument(fmt::format("{} is {}, which has no CUDA kernel (CUDA kernels take {})",
                                                        t->name, formats::info(t->type).name,
                                                        kernels::cuda::matvec_types()));
        const size_t gs = formats::row_size(l.gate.type, l.gate.n_cols), us = formats::row_size(l.up.type, l.up.n_cols),
                     ds = formats::row_size(l.down.type, l.down.n_cols);
        s.gate_stride.push_back(gs);
        s.up_stride.push_back(us);
        s.down_stride.push_back(ds);
        s.gate.push_back(0);
        s.up.push_back(gs * static_cast<size_t>(l.gate.n_rows));
        s.down.push_back(s.up.back() + us * static_cast<size_t>(l.up.n_rows));
        const size_t bytes = s.down.back() + ds * static_cast<size_t>(l.down.n_rows);
        // 256-byte aligned slots keep every block of every slot naturally aligned.
        s.slot_bytes = std::max(s.slot_bytes, (bytes + 255) / 256 * 256);
    }
    return s;
}

slot_copier::slot_copier(const std::vector<arenas::moe_layer>& layers, const arenas::expert_rows& rows,
                         arenas::pool_plan plan, arenas::moe_shape shape, const slot_layout& layout, uint8_t* slots,
                         int n_staging, bool background, const arenas::hot_node* hot)
    : layers_(layers), rows_(rows), plan_(std::move(plan)), shape_(shape), layout_(layout), slots_(slots),
      background_(background) {
    staging_.resize(static_cast<size_t>(std::max(n_staging, 1)));
    host_arrays ring;
    for (staging& s : staging_) ring.add(s.host, layout.slot_bytes);
    ring_ = ring.allocate(hot, "GPU expert staging (pinned)");
    if (background_) worker_ = std::thread([this] { work(); });
}

slot_copier::~slot_copier() {
    if (worker_.joinable()) {
        {
            std::lock_guard lock(m_);
            stop_ = true;
        }
        cv_.notify_all();
        worker_.join();
    }
    cudaStreamSynchronize(stream_);  // no copy may outlive its staging buffer
}

void slot_copier::gather_and_copy(const job& j) {
    staging& st = staging_[j.staging];
    if (st.used) st.done.synchronize();  // the buffer's previous copy has left it
    const arenas::moe_layer& l = layers_[static_cast<size_t>(j.key.layer)];
    const size_t li = static_cast<size_t>(j.key.layer);
    uint8_t* host = st.host.data();
    const int layer = j.key.layer, e = j.key.expert;
    arenas::gather_expert(rows_, plan_, shape_, layer, arenas::expert_part::gate, e, host + layout_.gate[li], layout_.gate_stride[li]);
    arenas::gather_expert(rows_, plan_, shape_, layer, arenas::expert_part::up, e, host + layout_.up[li], layout_.up_stride[li]);
    arenas::gather_expert(rows_, plan_, shape_, layer, arenas::expert_part::down, e, host + layout_.down[li], layout_.down_stride[li]);
    const size_t bytes = layout_.down[li] + layout_.down_stride[li] * static_cast<size_t>(l.down.n_rows);
    check(cudaStreamWaitEvent(stream_, st.compute_done, 0), "cudaStreamWaitEvent");
    copy_to_device(slots_ + static_cast<size_t>(j.slot) * layout_.slot_bytes, st.host.data(), bytes, stream_);
    st.done.record(stream_);
    st.used = true;
}

void slot_copier::work() {
    std::unique_lock lock(m_);
    for (;;) {
        cv_.wait(lock, [&] { return stop_ || !todo_.empty(); });
        if (todo_.empty()) return;
        const job j = todo_.front();
        lock.unlock();
        std::exception_ptr failed;
        try {
            gather_and_copy(j);
        } catch (...) {
            failed = std::current_exception();
        }
        lock.lock();
        todo_.pop_front();
        if (failed && !error_) error_ = failed;
        queued_ = j.id + 1;
        cv_.notify_all();
    }
}

expert_copier::ticket slot_copier::start(int slot, expert_key key) {
    const job j{next_++, slot, key, next_staging_};
    next_staging_ = (next_staging_ + 1) % staging_.size();
    // The slot's previous expert may still be read by work already queued on the compute stream.
    staging_[j.staging].compute_done.record(compute_);
    in_flight_.push_back(j);
    if (!background_) {
        gather_and_copy(j);
        return j.id;
    }
    {
        std::lock_guard lock(m_);
        if (error_) std::rethrow_exception(error_);
        todo_.push_back(j);
    }
    cv_.notify_all();
    return j.id;
}

bool slot_copier::queued(ticket t) {
    if (!background_) return true;
    std::lock_guard lock(m_);
    if (error_) std::rethrow_exception(error_);
    return t < queued_;
}

bool slot_copier::landed(ticket t) {
    for (auto it = in_flight_.begin(); it != in_flight_.end(); ++it)
        if (it->id == t) {
            if (!queued(t)) return false;
            // A staging buffer's event stands for its latest copy; older copies on it landed before.
            if (!staging_[it->staging].done.done()) return false;
            in_flight_.erase(it);
            return true;
        }
    return true;  // no longer tracked: landed
}

void slot_copier::wait(ticket t) {
    if (background_) {
        std::unique_lock lock(m_);
        cv_.wait(lock, [&] { return error_ || t < queued_; });
        if (error_) std::rethrow_exception(error_);
    }
    // Copies complete in issue order on one stream: waiting for the stream is enough.
    if (!landed(t)) stream_.synchronize();
    while (!in_flight_.empty() && in_flight_.front().id <= t) in_flight_.pop_front();
}

dense_matmul::dense_matmul(int64_t max_weight_elems, int64_t max_act_elems)
    : w16_(static_cast<size_t>(max_weight_elems)), x16_(static_cast<size_t>(max_act_elems)) {}

void dense_matmul::run(const dev_matrix& w, const float* x, int n_tok, float* y, int64_t y_stride, cudaStream_t s) {
    if (n_tok < kGemmTokens) {
        kernels::cuda::matvec(w.view(), x, w.n_cols, n_tok, y, y_stride, s);
        return;
    }
    kernels::cuda::dequantize_f16(w.view(), w16_.data(), s);
    kernels::cuda::convert_f32_to_f16(x, int64_t{n_tok} * w.n_cols, x16_.data(), s);
    // Row-major W [n_rows][n_cols] is column-major W^T; Y^T (n_rows x n_tok, column-major) = W X^T.
    const float one = 1.0f, zero = 0.0f;
    const cublas_api& blas = cublas_functions();
    check(blas.set_stream(blas_.get(), s), "cublasSetStream");
    check(blas.gemm_ex(blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n_rows), n_tok, static_cast<int>(w.n_cols),
                       &one, w16_.data(), CUDA_R_16F, static_cast<int>(w.n_cols), x16_.data(), CUDA_R_16F,
                       static_cast<int>(w.n_cols), &zero, y, CUDA_R_32F, static_cast<int>(y_stride), CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
}

}  // namespace strata::engine::gpu
