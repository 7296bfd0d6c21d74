/*
 * plan_cache.h — the per-process cache of library plans (cuBLASLt matmul
 * descriptors + algorithm, cuDNN execution plans), shared by matmul.cu and
 * conv.cu.
 *
 * Keys are byte strings the caller builds from everything that decides the
 * plan (shapes, strides, dtypes, epilogue, alignment, device, flags).
 * Values are shared_ptr<void> with their own deleter, so a plan stays valid
 * while a call that looked it up is still using it, even if another thread
 * replaces it.
 */
#ifndef GPUACCEL_PLAN_CACHE_H
#define GPUACCEL_PLAN_CACHE_H

#include <stdint.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

class GaPlanCache
{
  public:
    /* `counted` false: a lookup that repeats one already counted (the
     * second half of a call that came back to tune after a miss). */
    std::shared_ptr<void> find(const std::string &key, bool counted = true)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = plans_.find(key);
        if (it == plans_.end()) {
            misses_ += counted;
            return nullptr;
        }
        hits_ += counted;
        return it->second;
    }

    void insert(const std::string &key, std::shared_ptr<void> plan)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        plans_[key] = std::move(plan);
    }

    uint64_t hits() const
    {
        return hits_.load();
    }
    uint64_t misses() const
    {
        return misses_.load();
    }

  private:
    std::mutex mutex_;
    std::unordered_map<std::string, std::shared_ptr<void>> plans_;
    std::atomic<uint64_t> hits_{0}, misses_{0};
};

/* Appends the raw bytes of a value to a key. */
template <typename T> static inline void ga_key_append(std::string &key, const T &value)
{
    key.append(reinterpret_cast<const char *>(&value), sizeof value);
}

/* The two caches (defined in matmul.cu and conv.cu). */
GaPlanCache &ga_matmul_plan_cache();
GaPlanCache &ga_conv_plan_cache();

#endif
