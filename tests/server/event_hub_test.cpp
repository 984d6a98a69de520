// /v1/events messages: block views (complete, then bounded diffs as runs) and event fields.
#include "server/event_hub.hpp"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <thread>

namespace tessera::server {
namespace {

namespace json = boost::json;

block_tiles decode(const json::array& runs, block_tiles tiles) {
  for (size_t k = 0; k + 6 <= runs.size(); k += 6) {
    const auto start = runs[k].to_number<size_t>(), count = runs[k + 1].to_number<size_t>();
    for (size_t i = start; i < start + count; ++i) {
      tiles.at(i) = block_tile{request_id{runs[k + 2].to_number<uint64_t>()}, runs[k + 3].to_number<int32_t>(),
                               runs[k + 4].to_number<int32_t>(), runs[k + 5].to_number<int>() != 0};
    }
  }
  return tiles;
}

TEST(event_hub, block_runs_round_trip_full_and_diff) {
  block_tiles a(100), b;
  for (size_t i = 10; i < 30; ++i) a[i] = {request_id{7}, 1, 16, true};
  a[30] = {request_id{7}, 1, 5, false};
  a[31] = {request_id{0}, 0, 16, true};
  const auto full = encode_block_runs(a, nullptr);
  EXPECT_EQ(full.size(), 6u * 5) << "free, 20 equal blocks, a partial one, a cached free one, free";
  json::array arr;
  for (auto v : full) arr.push_back(v);
  EXPECT_EQ(decode(arr, block_tiles(100)), a);
  b = a;
  b[30] = {request_id{7}, 1, 6, false};
  b[50] = {request_id{9}, 2, 3, false};
  const auto diff = encode_block_runs(b, &a);
  EXPECT_EQ(diff.size(), 12u) << "only the two changed blocks";
  json::array darr;
  for (auto v : diff) darr.push_back(v);
  EXPECT_EQ(decode(darr, a), b);
  EXPECT_TRUE(encode_block_runs(b, &b).empty());
}

struct fake_engine {
  std::mutex mutex;
  actors::occupancy_ptr occupancy;
  int num_queries = 0;
  void set(uint64_t step, std::vector<block_info> blocks, int32_t num_device) {
    auto o = std::make_shared<actors::kv_occupancy>();
    o->step = o->blocks_step = step;
    o->device.num_total = num_device;
    o->host.num_total = static_cast<int32_t>(blocks.size()) - num_device;
    o->blocks = std::make_shared<const std::vector<block_info>>(std::move(blocks));
    std::lock_guard lock(mutex);
    occupancy = o;
  }
};

std::vector<block_info> blocks_with(int32_t num_device, int32_t num_host,
                                    std::initializer_list<std::pair<int, uint64_t>> held) {
  std::vector<block_info> out(static_cast<size_t>(num_device + num_host));
  for (auto [i, r] : held) {
    out[static_cast<size_t>(i)].ref_count = 1;
    out[static_cast<size_t>(i)].owner_request = request_id{r};
    out[static_cast<size_t>(i)].num_filled = 16;
  }
  return out;
}

actors::event_batch batch(uint64_t step, int32_t num_running = 1) {
  actors::event_batch b;
  auto r = std::make_shared<step_record>();
  r->step = step;
  r->num_running = num_running;
  r->device.num_total = 1000;
  engine_event e;
  e.kind = event_kind::preempted_swap;
  e.request = request_id{4};
  e.reason = preemption_reason::kv_full;
  e.swap_bytes = 4096;
  e.estimated_seconds = 0.002;
  e.at = engine_clock::now() - std::chrono::seconds(2);
  r->events.push_back(e);
  b.latest = r;
  b.events.push_back(actors::bus_event{step, e});
  b.num_records = 1;
  return b;
}

TEST(event_hub, sends_a_full_view_then_bounded_diffs_and_a_full_view_for_a_new_client) {
  event_hub_options o;
  o.block_interval = std::chrono::milliseconds(30);
  o.full_interval = std::chrono::seconds(60);
  event_hub hub(o);
  fake_engine engine;
  hub.set_block_source([&] {
    std::lock_guard lock(engine.mutex);
    ++engine.num_queries;
    return engine.occupancy;
  });
  std::vector<json::object> got;
  hub.add([&](event_hub::message m) { got.push_back(json::parse(*m).as_object()); });

  engine.set(1, blocks_with(1000, 200, {{0, 5}, {1, 5}, {1100, 6}}), 1000);
  hub.publish(batch(1));
  ASSERT_EQ(got.size(), 1u);
  const json::object& first = got[0].at("blocks").as_object();
  EXPECT_TRUE(first.at("full").as_bool());
  EXPECT_EQ(first.at("device").at("blocks").as_int64(), 1000);
  EXPECT_EQ(first.at("host").at("blocks").as_int64(), 200);
  block_tiles device = decode(first.at("device").at("runs").as_array(), block_tiles(1000));
  block_tiles host = decode(first.at("host").at("runs").as_array(), block_tiles(200));
  EXPECT_EQ(device[1].owner, request_id{5});
  EXPECT_EQ(host[100].owner, request_id{6}) << "host block 100 is entry 1000 + 100";
  EXPECT_LT(json::serialize(got[0]).size(), 1200u) << "a mostly free 1,200-block cache is a few runs";
  const auto& ev = got[0].at("events").as_array()[0].as_object();
  EXPECT_EQ(ev.at("kind").as_string(), "preempted_swap");
  EXPECT_EQ(ev.at("reason").as_string(), "kv_full");
  EXPECT_EQ(ev.at("swap_bytes").as_int64(), 4096);
  // How long ago it happened, so a viewer can place events of a coalesced batch in time.
  EXPECT_GE(ev.at("age").as_double(), 2.0);
  EXPECT_LT(ev.at("age").as_double(), 60.0);

  // Within the interval: no view (and no query of the engine).
  const int queries = engine.num_queries;
  engine.set(2, blocks_with(1000, 200, {{0, 5}, {1, 5}, {2, 5}, {1100, 6}}), 1000);
  hub.publish(batch(2));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_FALSE(got[1].contains("blocks"));
  EXPECT_EQ(engine.num_queries, queries);

  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  hub.publish(batch(3));
  ASSERT_EQ(got.size(), 3u);
  const json::object& diff = got[2].at("blocks").as_object();
  EXPECT_FALSE(diff.at("full").as_bool());
  EXPECT_EQ(diff.at("since").as_int64(), 1);
  EXPECT_EQ(diff.at("step").as_int64(), 2);
  EXPECT_EQ(diff.at("device").at("runs").as_array().size(), 6u) << "only block 2 changed";
  device = decode(diff.at("device").at("runs").as_array(), device);
  EXPECT_EQ(device[2].owner, request_id{5});

  // Unchanged blocks: nothing to send even after the interval.
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  hub.publish(batch(4));
  EXPECT_FALSE(got.back().contains("blocks"));

  // The engine went idle right after a view: the final view is sent at once (nothing follows it).
  engine.set(5, blocks_with(1000, 200, {{0, 5}}), 1000);
  hub.publish(batch(5));
  ASSERT_TRUE(got.back().contains("blocks"));
  device = decode(got.back().at("blocks").at("device").at("runs").as_array(), device);
  engine.set(6, blocks_with(1000, 200, {}), 1000);
  hub.publish(batch(6, /*num_running=*/0));
  ASSERT_TRUE(got.back().contains("blocks"));
  device = decode(got.back().at("blocks").at("device").at("runs").as_array(), device);
  EXPECT_EQ(device, block_tiles(1000)) << "every block free again";

  // A new client joins: the next view is complete, for everyone.
  std::vector<json::object> second;
  hub.add([&](event_hub::message m) { second.push_back(json::parse(*m).as_object()); });
  engine.set(7, blocks_with(1000, 200, {{3, 8}}), 1000);
  hub.publish(batch(7));
  ASSERT_EQ(second.size(), 1u);
  EXPECT_TRUE(second[0].at("blocks").at("full").as_bool());
  device[3] = {request_id{8}, 1, 16, false};
  EXPECT_EQ(decode(second[0].at("blocks").at("device").at("runs").as_array(), block_tiles(1000)), device);

  // A client's first message (before any step) describes the pools as they are.
  const std::optional<std::string> hello = hub.initial_message();
  ASSERT_TRUE(hello);
  const json::object h = json::parse(*hello).as_object();
  EXPECT_FALSE(h.contains("step"));
  EXPECT_TRUE(h.at("blocks").at("full").as_bool());
  EXPECT_EQ(decode(h.at("blocks").at("device").at("runs").as_array(), block_tiles(1000)), device);
}

TEST(event_hub, large_pools_get_views_less_often) {
  event_hub_options o;
  o.block_interval = std::chrono::milliseconds(1);
  o.blocks_per_second_budget = 1000;  // 2,000 blocks: at most one view per 2 s
  event_hub hub(o);
  fake_engine engine;
  hub.set_block_source([&] { return engine.occupancy; });
  int num_views = 0;
  hub.add([&](event_hub::message m) { num_views += json::parse(*m).as_object().contains("blocks"); });
  for (int step = 1; step <= 20; ++step) {
    engine.set(static_cast<uint64_t>(step), blocks_with(2000, 0, {{step, 1u}}), 2000);
    hub.publish(batch(static_cast<uint64_t>(step)));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(num_views, 1);
}

TEST(event_hub, without_a_block_source_or_snapshot_messages_have_no_blocks) {
  event_hub hub;
  std::string last;
  hub.add([&](event_hub::message m) { last = *m; });
  hub.publish(batch(1));
  EXPECT_EQ(last.find("\"blocks\""), std::string::npos);
  hub.set_block_source([] { return actors::occupancy_ptr(); });
  hub.publish(batch(2));
  EXPECT_EQ(last.find("\"blocks\""), std::string::npos);
  EXPECT_NO_THROW(json::parse(last));
}

}  // namespace
}  // namespace tessera::server
