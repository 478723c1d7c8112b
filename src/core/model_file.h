// Packed model files (.qpk, docs/FORMAT.md): packed ops, frozen graphs over
// them and an opaque host section, saved once and loaded by mapping the file
// read-only, the packed bytes used in place when this machine's kernels want
// their layout. The one place that knows the file's layout; each backend
// describes its own packed layouts (Kernel::packed_form, OpSupport::load).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/op.h"
#include "core/packed_op.h"

namespace qpack {

// One packed op of a file: exactly one of the two is set.
struct ModelOp {
  std::shared_ptr<const Linear> linear;
  std::shared_ptr<const Conv> conv;
  const void* key() const {
    return linear ? static_cast<const void*>(linear.get()) : static_cast<const void*>(conv.get());
  }
};

struct LoadOptions {
  bool map = true;      // mmap the file (shared, read-only); else read it into memory
  bool verify = true;   // check every section's checksum
  bool strict = false;  // refuse (FILE_FORMAT) instead of re-packing a layout packed elsewhere
};

// What a file held, loaded.
struct Model {
  std::vector<ModelOp> ops;                    // by index, as graphs and the host refer to them
  std::vector<std::shared_ptr<Graph>> graphs;
  Blob host;                                   // empty when the file has no host section
  std::vector<Blob> data;                      // DATA sections (the host's large arrays), in order
  std::vector<uint64_t> data_offsets;          // their offsets in the file
  size_t file_size = 0;
  bool mapped = false;
  size_t nbytes_in_place = 0;                  // packed bytes used from the file as they are
  std::vector<std::string> repacked;           // one line per op re-packed, and why
};

// Writes ops (in this order), then the ops of `graphs` not among them, the
// graphs, the host bytes and the data blobs to `path` (a temporary file
// renamed over it). with_originals: the original weights of ops that still
// hold them.
void save_model(const std::string& path, std::vector<ModelOp> ops,
                const std::vector<std::shared_ptr<const Graph>>& graphs, const void* host,
                size_t host_size, const std::vector<Blob>& data, bool with_originals);

// Reads and validates a file (FILE_FORMAT / IO naming what failed); from
// `fd` when >= 0 (not closed; `path` names it in messages), else opens path.
std::shared_ptr<Model> load_model(const std::string& path, const LoadOptions& options, int fd = -1);

}  // namespace qpack
