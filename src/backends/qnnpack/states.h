// Copy-on-write packed states of one QNNPACK weight, keyed by input scale.
//
// QNNPACK bakes an int32 bias (bias / (input_scale * weight_scale)) into its
// packed weights, so a new input scale needs new packed bytes. A state is
// immutable once published; runs take the latest one lock-free, and a missing
// one is built from an existing state (never from the released original)
// under a lock held only by builders, then published atomically. Runs in
// flight keep the state they started with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/op.h"
#include "core/quant.h"

namespace qpack {
namespace qnnpack_rt {

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
// Packed bytes: a heap buffer of qpack's, or bytes of a mapped model file
// (never written: a new input scale copies them first).
using Buffer = std::shared_ptr<uint8_t>;

inline Buffer allocate_packed(size_t size) {
  void* p = nullptr;
  check(posix_memalign(&p, 64, size) == 0 && p != nullptr, QPACK_STATUS_OUT_OF_MEMORY,
        "could not allocate ", size, " bytes for QNNPACK packed weights");
  return Buffer(static_cast<uint8_t*>(p), FreeDeleter());
}

// The bytes of a saved blob, kept alive by the blob's owner.
inline Buffer saved_buffer(const Blob& blob) {
  return Buffer(blob.owner, const_cast<uint8_t*>(blob.data));
}

// Per-channel weight_scale * input_scale / output_scale, padded like the weight
// scales (padding stays 1); each must be a positive normal float.
inline std::vector<float> requant_scales(const std::vector<float>& padded_weight_scales,
                                         int64_t channels, float input_scale,
                                         float output_scale) {
  std::vector<float> r(padded_weight_scales.size(), 1.0f);
  const float inverse_output_scale = 1.0f / output_scale;
  for (int64_t n = 0; n < channels; ++n) {
    r[n] = (padded_weight_scales[n] * input_scale) * inverse_output_scale;
    check(r[n] > 0.0f && std::isnormal(r[n]), QPACK_STATUS_INVALID_ARGUMENT,
          "requantization scale weight_scale * input_scale / output_scale = ", r[n],
          " for output channel ", n, " is not a positive normal float; check the scales");
  }
  return r;
}

struct BiasState {
  float input_scale = 0;  // 0: bias slots not filled yet (or unused: dynamic)
  Buffer packed;
  std::vector<float> requant_scales;  // static only
};

class BiasStates {
 public:
  explicit BiasStates(Counters& counters) : counters_(counters) {}

  // The first state: a copy of the packed_size bytes QNNPACK's packer made
  // (null when it could not allocate), for input_scale (0: not known yet)
  // with its requantization scales.
  void publish_first(const void* packed_by_qnnpack, size_t packed_size, float input_scale,
                     std::vector<float> requant_scales) {
    check(packed_by_qnnpack != nullptr, QPACK_STATUS_OUT_OF_MEMORY, "QNNPACK could not allocate ",
          packed_size, " bytes for packed weights");
    Buffer packed = allocate_packed(packed_size);
    std::memcpy(packed.get(), packed_by_qnnpack, packed_size);
    publish_first(std::move(packed), packed_size, input_scale, std::move(requant_scales));
  }
  // The first state over packed bytes as they are (a saved blob).
  void publish_first(Buffer packed, size_t packed_size, float input_scale,
                     std::vector<float> requant_scales) {
    auto state = std::make_shared<BiasState>();
    state->input_scale = input_scale;
    state->packed = std::move(packed);
    state->requant_scales = std::move(requant_scales);
    std::lock_guard<std::mutex> lock(mutex_);
    packed_size_ = packed_size;
    cache_.insert(cache_.begin(), state);
    std::atomic_store(&latest_, std::shared_ptr<const BiasState>(std::move(state)));
    counters_.built();
  }

  std::shared_ptr<const BiasState> latest() const { return std::atomic_load(&latest_); }

  // The state for input_scale: lock-free when it is the latest; otherwise
  // found in the cache or built. requant(scale) validates and returns the
  // requantization scales, bias(scale) the int32 bias, slot(n) the byte
  // offset of channel n's bias in the packed buffer.
  template <typename Requant, typename Bias, typename Slot>
  std::shared_ptr<const BiasState> get(float input_scale, int64_t channels,
                                       const Requant& requant, const Bias& bias,
                                       const Slot& slot) const {
    auto latest = std::atomic_load(&latest_);
    if (latest->input_scale == input_scale) {
      counters_.hit();
      return latest;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& s : cache_) {
      if (s->input_scale == input_scale) {
        counters_.hit();
        std::atomic_store(&latest_, s);
        return s;
      }
    }
    auto scales = requant(input_scale);  // validates before any allocation
    auto state = std::make_shared<BiasState>();
    state->input_scale = input_scale;
    state->packed = allocate_packed(packed_size_);
    std::memcpy(state->packed.get(), cache_.front()->packed.get(), packed_size_);
    const std::vector<int32_t> qbias = bias(input_scale);
    for (int64_t n = 0; n < channels; ++n) {
      std::memcpy(state->packed.get() + slot(n), &qbias[n], sizeof(int32_t));
    }
    state->requant_scales = std::move(scales);
    std::shared_ptr<const BiasState> published = std::move(state);
    cache_.insert(cache_.begin(), published);
    // A placeholder packed before the input scale was known is never needed again.
    cache_.erase(std::remove_if(cache_.begin() + 1, cache_.end(),
                                [](const std::shared_ptr<const BiasState>& s) {
                                  return s->input_scale == 0.0f;
                                }),
                 cache_.end());
    while (cache_.size() > kCapacity) {
      cache_.pop_back();
      counters_.evicted();
    }
    counters_.built();
    std::atomic_store(&latest_, published);
    return published;
  }

  // Bytes held by the cached states.
  size_t nbytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t total = 0;
    for (const auto& s : cache_) total += packed_size_ + s->requant_scales.size() * sizeof(float);
    return total;
  }

 private:
  static constexpr size_t kCapacity = 2;

  size_t packed_size_ = 0;  // set once by publish_first
  Counters& counters_;
  mutable std::shared_ptr<const BiasState> latest_;  // atomic_load/store only
  mutable std::mutex mutex_;                         // builders only; guards cache_
  mutable std::vector<std::shared_ptr<const BiasState>> cache_;
};

}  // namespace qnnpack_rt
}  // namespace qpack
