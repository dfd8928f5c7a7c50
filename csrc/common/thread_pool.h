// Pixels stage (native): the persistent decode thread pool.
//
// Created once per process and grown on demand; re-created in a forked child, which inherits no
// threads (fork-safe: see thread_pool.cpp). A batch is one job: the calling thread works on it too,
// pool workers join up to the requested thread count, and items are handed out through an atomic
// counter so big and small images balance. Several jobs (e.g. two loaders in two Python threads) may
// run at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

namespace fastload {

class ThreadPool {
 public:
  // The process-wide pool.
  static ThreadPool& instance();

  // Runs fn(i) for every i in [0, n) on the calling thread plus up to threads - 1 workers; returns
  // when all are done. fn must not throw.
  void run(int n, int threads, const std::function<void(int)>& fn);

  // Sets the number of worker threads (threads - 1 of a call can be pool workers); waits for running
  // jobs before shrinking.
  void set_workers(int workers);
  int workers() const;

  ~ThreadPool();

 private:
  struct Job {
    const std::function<void(int)>* fn = nullptr;
    int n = 0;
    int max_helpers = 0;
    int helpers = 0;  // guarded by mu_
    std::atomic<int> next{0};
  };

  ThreadPool() = default;
  void worker_loop();
  void grow_locked(int workers);
  void stop_all_locked(std::unique_lock<std::mutex>& lock);
  static void drain(Job* job);
  Job* pick_locked();

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::list<Job*> jobs_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  int active_jobs_ = 0;
};

// Testing hook: a background thread takes the lock that guards the pool's creation and holds it
// for `milliseconds` (returns once it is held), so a test can fork while another thread is inside
// ThreadPool::instance() and check that the child does not inherit a locked mutex.
void hold_pool_creation_lock_for_testing(int milliseconds);

}  // namespace fastload
