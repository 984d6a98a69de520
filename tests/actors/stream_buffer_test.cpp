// The stream buffer between a request's sink actor and its reader, without actors: bounded merging,
// the blocking reader, and the ready hook a non-blocking reader (the server's sessions) relies on:
// one call when the buffer goes from empty to non-empty, none while a call is unanswered, again once a
// read found or left the buffer empty, and none after removal; with a producer and a hook-driven
// consumer on two threads, every token arrives in order and no wake-up is lost.
#include "actors/stream_buffer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace tessera::actors {
namespace {

using namespace std::chrono_literals;

stream_delta delta(int32_t index, token_id token) {
  stream_delta d;
  d.output.index = index;
  d.output.token_ids = {token};
  d.output.text = std::string(1, static_cast<char>('a' + token % 26));
  return d;
}

stream_final final_message() {
  stream_final f;
  f.reason = finish_reason::length;
  return f;
}

TEST(stream_buffer, the_hook_fires_on_empty_to_non_empty_and_once_per_drain) {
  stream_buffer b(16);
  int calls = 0;
  b.on_ready([&] { ++calls; });
  EXPECT_EQ(calls, 0) << "nothing waiting: no call";
  b.push_delta(delta(0, 1));
  EXPECT_EQ(calls, 1) << "empty -> non-empty";
  b.push_delta(delta(0, 2));
  b.push_delta(delta(0, 3));
  EXPECT_EQ(calls, 1) << "coalesced while the first call is unanswered";
  EXPECT_EQ(b.take_all().size(), 3u);
  EXPECT_EQ(calls, 1) << "a read calls nothing";
  b.push_delta(delta(0, 4));
  EXPECT_EQ(calls, 2) << "the drain re-armed the hook";
  // A blocking read that leaves the buffer empty re-arms it too; one that leaves items does not.
  b.push_delta(delta(0, 5));
  ASSERT_TRUE(b.next(0ms));
  b.push_delta(delta(0, 6));
  EXPECT_EQ(calls, 2) << "one item still waits: the outstanding call covers it";
  ASSERT_TRUE(b.next(0ms));
  ASSERT_TRUE(b.next(0ms));
  b.push_final(final_message());
  EXPECT_EQ(calls, 3);
  const std::vector<stream_item> rest = b.take_all();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<stream_final>(rest[0]));
  b.push_delta(delta(0, 7));
  EXPECT_EQ(calls, 3) << "nothing after the final";
  EXPECT_TRUE(b.take_all().empty());
  EXPECT_FALSE(b.next(0ms)) << "the final was taken";
}

TEST(stream_buffer, a_hook_set_while_items_wait_fires_at_once_and_a_removed_one_never) {
  stream_buffer b(16);
  b.push_delta(delta(0, 1));
  int calls = 0;
  b.on_ready([&] { ++calls; });
  EXPECT_EQ(calls, 1) << "items were already waiting";
  EXPECT_EQ(b.take_all().size(), 1u);
  b.on_ready({});
  b.push_delta(delta(0, 2));
  b.push_final(final_message());
  EXPECT_EQ(calls, 1) << "removed";
  EXPECT_EQ(b.take_all().size(), 2u);
}

TEST(stream_buffer, a_full_buffer_merges_into_the_newest_delta_of_the_same_choice) {
  stream_buffer b(2);
  int calls = 0;
  b.on_ready([&] { ++calls; });
  b.push_delta(delta(0, 1));
  b.push_delta(delta(1, 2));
  b.push_delta(delta(0, 3));  // full: merged into the first delta (choice 0)
  b.push_delta(delta(1, 4));  // merged into the second (choice 1)
  EXPECT_EQ(calls, 1);
  const std::vector<stream_item> items = b.take_all();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(std::get<stream_delta>(items[0]).output.token_ids, (std::vector<token_id>{1, 3}));
  EXPECT_EQ(std::get<stream_delta>(items[1]).output.token_ids, (std::vector<token_id>{2, 4}));
  EXPECT_EQ(std::get<stream_delta>(items[0]).output.text, "bd");
}

// The server's pattern on two threads: the hook only posts a wake-up to the consumer's queue; the
// consumer drains with take_all() per wake-up and never blocks on the buffer itself. A lost wake-up
// would leave the consumer waiting with items in the buffer (the wait times out and the test fails).
TEST(stream_buffer, a_hook_driven_consumer_gets_every_token_in_order_with_at_most_one_call_outstanding) {
  constexpr int num_tokens = 200000;
  stream_buffer b(64);
  std::mutex mutex;
  std::condition_variable cv;
  int posted = 0;
  std::atomic<int> outstanding{0};
  std::atomic<int> max_outstanding{0};
  b.on_ready([&] {
    const int now = outstanding.fetch_add(1) + 1;
    if (now > max_outstanding.load()) max_outstanding.store(now);
    {
      std::lock_guard lock(mutex);
      ++posted;
    }
    cv.notify_one();
  });
  std::thread producer([&] {
    for (int i = 0; i < num_tokens; ++i) b.push_delta(delta(i % 2, i));
    b.push_final(final_message());
  });
  std::vector<token_id> got[2];
  int num_wakeups = 0;
  bool done = false;
  while (!done) {
    {
      std::unique_lock lock(mutex);
      ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return posted > 0; })) << "a wake-up was lost";
      --posted;
    }
    ++num_wakeups;
    outstanding.fetch_sub(1);  // answered: what follows is the read that re-arms the hook
    for (stream_item& item : b.take_all()) {
      if (auto* d = std::get_if<stream_delta>(&item)) {
        auto& to = got[d->output.index];
        to.insert(to.end(), d->output.token_ids.begin(), d->output.token_ids.end());
      } else {
        done = true;
      }
    }
  }
  producer.join();
  EXPECT_EQ(max_outstanding.load(), 1);
  EXPECT_GT(num_wakeups, 0);
  for (int c = 0; c < 2; ++c) {
    ASSERT_EQ(got[c].size(), static_cast<size_t>(num_tokens / 2)) << "choice " << c;
    for (size_t k = 0; k < got[c].size(); ++k) {
      ASSERT_EQ(got[c][k], static_cast<token_id>(2 * k + static_cast<size_t>(c))) << "choice " << c << " token " << k;
    }
  }
}

}  // namespace
}  // namespace tessera::actors
