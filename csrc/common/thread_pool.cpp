// Pixels stage (native): the persistent decode thread pool.
#include "common/thread_pool.h"

#include <pthread.h>

#include <chrono>
#include <future>

namespace fastload {

namespace {

// The process-wide pool and the mutex that guards its creation. fork() copies a mutex in whatever
// state it is in: had another thread been inside instance() at that moment, the child's copy would
// stay locked forever and its first decode would deadlock. The pthread_atfork handlers below take
// the mutex around fork(), so the child's copy is always consistent and owned by the one thread the
// child has.
std::mutex g_create_mu;
ThreadPool* g_pool = nullptr;

void before_fork() { g_create_mu.lock(); }
void after_fork_in_parent() { g_create_mu.unlock(); }
void after_fork_in_child() {
  // The child inherits the pool object but none of its threads, and its job mutex may be held by
  // a thread that no longer exists: the object is abandoned (never joined or destroyed) and a fresh
  // pool is made on first use.
  g_pool = nullptr;
  g_create_mu.unlock();
}

// Registered when the engine is loaded, before any of its threads exist.
const int g_atfork_registered = pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);

}  // namespace

void hold_pool_creation_lock_for_testing(int milliseconds) {
  std::promise<void> held;
  std::future<void> ready = held.get_future();
  std::thread([milliseconds, held = std::move(held)]() mutable {
    std::lock_guard<std::mutex> guard(g_create_mu);
    held.set_value();
    std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds));
  }).detach();
  ready.wait();
}

ThreadPool& ThreadPool::instance() {
  (void)g_atfork_registered;
  std::lock_guard<std::mutex> guard(g_create_mu);
  if (g_pool == nullptr) g_pool = new ThreadPool();
  return *g_pool;
}

ThreadPool::~ThreadPool() {
  std::unique_lock<std::mutex> lock(mu_);
  stop_all_locked(lock);
}

int ThreadPool::workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(threads_.size());
}

void ThreadPool::grow_locked(int workers) {
  while (static_cast<int>(threads_.size()) < workers) threads_.emplace_back([this] { worker_loop(); });
}

void ThreadPool::stop_all_locked(std::unique_lock<std::mutex>& lock) {
  done_cv_.wait(lock, [this] { return active_jobs_ == 0; });
  stop_ = true;
  work_cv_.notify_all();
  std::vector<std::thread> old;
  old.swap(threads_);
  lock.unlock();
  for (auto& t : old) t.join();
  lock.lock();
  stop_ = false;
}

void ThreadPool::set_workers(int workers) {
  std::unique_lock<std::mutex> lock(mu_);
  if (workers < 0) workers = 0;
  if (workers < static_cast<int>(threads_.size())) stop_all_locked(lock);
  grow_locked(workers);
}

ThreadPool::Job* ThreadPool::pick_locked() {
  for (Job* job : jobs_) {
    if (job->helpers < job->max_helpers && job->next.load(std::memory_order_relaxed) < job->n) return job;
  }
  return nullptr;
}

void ThreadPool::drain(Job* job) {
  for (;;) {
    const int i = job->next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job->n) return;
    (*job->fn)(i);
  }
}

void ThreadPool::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    Job* job = nullptr;
    work_cv_.wait(lock, [&] { return stop_ || (job = pick_locked()) != nullptr; });
    if (stop_) return;
    job->helpers++;
    lock.unlock();
    drain(job);
    lock.lock();
    job->helpers--;
    if (job->helpers == 0) done_cv_.notify_all();
  }
}

void ThreadPool::run(int n, int threads, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (threads > n) threads = n;
  if (threads <= 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  Job job;
  job.fn = &fn;
  job.n = n;
  job.max_helpers = threads - 1;
  std::unique_lock<std::mutex> lock(mu_);
  grow_locked(threads - 1);
  jobs_.push_back(&job);
  active_jobs_++;
  lock.unlock();
  work_cv_.notify_all();
  drain(&job);
  lock.lock();
  jobs_.remove(&job);
  done_cv_.wait(lock, [&] { return job.helpers == 0; });
  active_jobs_--;
  done_cv_.notify_all();
}

}  // namespace fastload
