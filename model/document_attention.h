// Attention that restarts at document boundaries without a T x T mask: each document of a row is
// attended as its own causal sequence (SDPA with is_causal over the document's segment of q, k
// and v), the way packed variable-length attention (FlashAttention's varlen, Megatron's THD
// format) computes it. The plan (DocumentRuns) is read once per forward from the segment ids on
// the host; every block's attention then follows it with no device read.
//
// Batching: rows with the same document lengths are attended together (one SDPA per document of
// the group, over all of the group's rows), so a batch without any boundary is one plain causal
// SDPA and rows holding one whole document each share one call. Rows are reordered by group only
// when some group's rows are not already adjacent (an index_select of q, k and v, and of the
// output back).
#ifndef ORTHOSHARD_MODEL_DOCUMENT_ATTENTION_H_
#define ORTHOSHARD_MODEL_DOCUMENT_ATTENTION_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace orthoshard::model {

// How a row's documents are attended.
struct DocumentRuns {
  // Rows with identical document lengths, in order of first appearance: each group's row count
  // and its documents' lengths (positive, summing to T).
  std::vector<int64_t> group_rows;
  std::vector<std::vector<int64_t>> group_lengths;
  // [B] int64 on the segments' device: the rows in group order (row_order[i] is the row at
  // position i), and its inverse; undefined when the groups are already in row order.
  at::Tensor row_order, inverse_order;

  // True when every row is one document (one group of one length T): plain causal attention.
  bool causal() const { return group_lengths.size() == 1 && group_lengths[0].size() == 1; }
};

// The plan of `segments` [B, T] int64 (each row's document ids, non-decreasing; a document is a
// run of equal ids): one copy to the host. The caller checks the shape and dtype.
DocumentRuns PlanDocumentRuns(const at::Tensor& segments);

// SDPA of q [B, H, T, D] over k, v [B, KV, T, D] (H a multiple of KV: grouped-query attention by
// the kernel's enable_gqa when H > KV), causal within each document of `runs`, never across
// documents. Returns [B, H, T, D], differentiable in q, k and v; the same values as
// scaled_dot_product_attention with the [B, 1, T, T] mask "same document and not later", up to
// rounding (each query's softmax runs over the same keys, in other kernel calls).
at::Tensor DocumentSdpa(const DocumentRuns& runs, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v);

// MaxAttentionLogits (model/qk_clip.h) of q and k under the documents' causal mask, computed per
// document (no T x T tensor): fp32 [H].
at::Tensor DocumentMaxAttentionLogits(const DocumentRuns& runs, const at::Tensor& q,
                                      const at::Tensor& k);

// The dense mask of `segments` [B, T]: [B, 1, T, T] bool, true where a query may attend a key
// (same document and not later). For the masked path (Documents::attention kMask).
at::Tensor DocumentMask(const at::Tensor& segments);

}  // namespace orthoshard::model

#endif  // ORTHOSHARD_MODEL_DOCUMENT_ATTENTION_H_
