// Little-endian records of a model file (docs/FORMAT.md): ByteWriter appends
// fixed-width values, ByteReader reads them back with every read checked
// against the record's bytes (FILE_FORMAT naming the record and the field).
// qpack runs on little-endian CPUs only (x86-64, aarch64), so values are
// copied as they are in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace qpack {

class ByteWriter {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_arithmetic<T>::value, "fixed-width values only");
    append(&v, sizeof v);
  }
  // u32 count, then the values.
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    put(static_cast<uint32_t>(v.size()));
    append(v.data(), v.size() * sizeof(T));
  }
  void append(const void* data, size_t n) {
    const auto* b = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, std::string what)
      : data_(data), size_(size), what_(std::move(what)) {}

  template <typename T>
  T get() {
    static_assert(std::is_arithmetic<T>::value, "fixed-width values only");
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  // u32 count (at most max_count), then the values.
  template <typename T>
  std::vector<T> get_vec(size_t max_count, const char* field) {
    const uint32_t n = get<uint32_t>();
    expect(n <= max_count && n <= remaining() / sizeof(T), field);
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), take(n * sizeof(T)), n * sizeof(T));
    return v;
  }
  const uint8_t* take(size_t n) {
    expect(n <= remaining(), "length (the record ends early)");
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  size_t remaining() const { return size_ - pos_; }
  void expect(bool ok, const char* field) const {
    check(ok, QPACK_STATUS_FILE_FORMAT, what_, ": bad ", field,
          "; the file is corrupt or was not written by this qpack (re-freeze and save it again)");
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace qpack
