// Freed resources kept for a later request with exactly the same key: the most recently kept match is handed
// out, and past a bound the oldest are dropped, returned to the caller so that they are freed after the lock
// is let go. The host block pool (mat.cpp) and each context's device buffer cache (buffer.cpp) are this.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

namespace vknorm {

template <typename Key, typename T>
class ReuseCache {
 public:
  std::optional<T> take(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)  // the most recently kept first
      if (it->key == key) {
        std::optional<T> found(std::move(it->value));
        bytes_ -= it->bytes;
        entries_.erase(std::next(it).base());
        return found;
      }
    return std::nullopt;
  }
  // Keeps value (of `bytes`), then drops the oldest while more than max_bytes or max_count are kept.
  [[nodiscard]] std::vector<T> put(const Key& key, uint64_t bytes, T value, uint64_t max_bytes,
                                   size_t max_count = SIZE_MAX) {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.push_back({key, bytes, std::move(value)});
    bytes_ += bytes;
    return drop_locked(max_bytes, max_count);
  }
  // Drops the oldest until at most max_bytes are kept.
  [[nodiscard]] std::vector<T> trim(uint64_t max_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    return drop_locked(max_bytes, SIZE_MAX);
  }
  uint64_t bytes() const { return bytes_; }
  size_t count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }

 private:
  struct Entry {
    Key key;
    uint64_t bytes;
    T value;
  };
  std::vector<T> drop_locked(uint64_t max_bytes, size_t max_count) {
    std::vector<T> dropped;
    while (!entries_.empty() && (bytes_ > max_bytes || entries_.size() > max_count)) {
      bytes_ -= entries_.front().bytes;
      dropped.push_back(std::move(entries_.front().value));
      entries_.pop_front();
    }
    return dropped;
  }
  mutable std::mutex mutex_;
  std::deque<Entry> entries_;  // oldest first
  std::atomic<uint64_t> bytes_{0};
};

}  // namespace vknorm
