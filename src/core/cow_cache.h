// A bounded copy-on-write cache: lookups take no lock (one atomic load of an
// immutable list); a miss builds under a mutex held only by builders and
// publishes a new list atomically. Entries handed out stay alive while held,
// even after eviction. Used for oneDNN primitives (per shape and thread count)
// and for graph plans (per input shape).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "core/op.h"

namespace qpack {

template <typename Entry>
class CowCache {
 public:
  using Ptr = std::shared_ptr<const Entry>;

  // counters (may be null): a lookup that finds its entry counts a hit, one
  // dropped past the capacity an eviction.
  CowCache(size_t capacity, Counters* counters)
      : capacity_(capacity), counters_(counters), list_(std::make_shared<const List>()) {}

  // The entry for which matches(entry) holds, or the one build() makes.
  // keep(old, fresh) says whether an older entry stays once `fresh` is added.
  template <typename Matches, typename Build, typename Keep>
  Ptr get(const Matches& matches, const Build& build, const Keep& keep) const {
    if (Ptr e = find(matches)) return e;
    std::lock_guard<std::mutex> lock(mutex_);
    if (Ptr e = find(matches)) return e;
    auto next = std::make_shared<List>();
    Ptr fresh = std::make_shared<const Entry>(build());
    next->push_back(fresh);
    const auto current = std::atomic_load(&list_);  // (see find)
    for (const auto& old : *current) {
      if (!keep(*old, *fresh)) continue;
      if (next->size() >= capacity_) {
        if (counters_ != nullptr) counters_->evicted();
        continue;
      }
      next->push_back(old);
    }
    std::atomic_store(&list_, std::shared_ptr<const List>(std::move(next)));
    return fresh;
  }

  template <typename Matches, typename Build>
  Ptr get(const Matches& matches, const Build& build) const {
    return get(matches, build, [](const Entry&, const Entry&) { return true; });
  }

  // Every entry now.
  std::vector<Ptr> entries() const { return *std::atomic_load(&list_); }

 private:
  using List = std::vector<Ptr>;

  template <typename Matches>
  Ptr find(const Matches& matches) const {
    // The list held for the whole loop: `for (e : *std::atomic_load(&list_))` drops the
    // loaded pointer before the loop runs (a range-for extends the life of the list
    // reference, not of the temporary shared_ptr), so a builder publishing a new list
    // could free the one being read (TSan saw it: two threads building primitives for
    // one convolution on a CPU without VNNI).
    const auto list = std::atomic_load(&list_);
    for (const auto& e : *list) {
      if (matches(*e)) {
        if (counters_ != nullptr) counters_->hit();
        return e;
      }
    }
    return nullptr;
  }

  const size_t capacity_;
  Counters* const counters_;
  mutable std::shared_ptr<const List> list_;  // atomic_load/store only
  mutable std::mutex mutex_;                  // builders only
};

}  // namespace qpack
