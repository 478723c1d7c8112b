// Scaled dot-product attention in fp32 (qpack_attention_f32): for each batch
// and head, out = softmax(scale Q K^T [+ mask] [causal]) V, one query row at a
// time over all keys (the scores of a row, S floats, in a per-thread buffer).
// With AVX-512 the products run on 16-lane FMAs over K transposed per head
// (4 query rows x 4 vectors of keys a tile) and over V's rows (4 query rows x
// up to 4 vectors of the head dim); elsewhere plain loops. The softmax is
// vec_math's (exp within 2 ulp), so values agree with PyTorch's
// scaled_dot_product_attention to float rounding, not bit for bit.
#pragma once

#include <cstdint>

namespace qpack {

struct AttentionF32 {
  const float* q;  // [B][H][L][D], strides below in elements; the last dim contiguous
  const float* k;  // [B][H][S][D]
  const float* v;  // [B][H][S][Dv]
  float* out;      // [B][H][L][Dv]
  int64_t q_stride[3], k_stride[3], v_stride[3], out_stride[3];  // of B, H, the row
  int64_t B, H, L, S, D, Dv;
  float scale;
  bool causal;  // query i sees keys j <= i (PyTorch's is_causal, top-left)
  // Added to the scaled scores before the softmax (PyTorch's float attn_mask; a
  // position bias), or null: [B][H][L][S], strides of B, H, the row (0 where it
  // is the same for every batch or head); each row's S floats contiguous.
  const float* mask = nullptr;
  int64_t mask_stride[3] = {0, 0, 0};
  // With mask_groups > 0, batch b reads the mask of b % mask_groups (at that
  // times mask_stride[0]): masks that repeat over the batch in groups (Swin's
  // shifted windows, one mask per window position, the batch the windows of
  // several images); 0: batch b's at b times mask_stride[0].
  int64_t mask_groups = 0;
  // A second addend, or null: masks [G][L][S] (row stride S, the same for every
  // head), batch b reading mask b % window_groups (Swin's shifted windows: one
  // mask per window, its heads' position bias in `mask` once).
  const float* window_mask = nullptr;
  int64_t window_groups = 0;
};

// Checks the arguments (qpack::Error on bad ones) and runs on num_threads().
void attention_f32(const AttentionF32& a);

}  // namespace qpack
