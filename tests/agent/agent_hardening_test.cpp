// Each attack from issue 14 reproduced against a real agent (real gRPC over
// its unix socket, real HTTP, real SQLite file), then the defence checked.

#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_context.h>
#include <grpcpp/impl/codegen/sync_stream.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "agent/ctl/ctl_commands.h"
#include "agent/export/http_server.h"
#include "agent/server/agent.h"
#include "agent/testing/sim_trainer.h"
#include "gaugewatch/v1/admin_service.grpc.pb.h"
#include "tests/agent/agent_test_calls.h"
#include "tests/agent/agent_test_env.h"

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;

int tcp_connect(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A hook stream on raw bytes: what a broken or hostile client can send.
class RawStream {
 public:
  explicit RawStream(const std::shared_ptr<grpc::Channel>& channel)
      : stream_(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel.get(),
            grpc::internal::RpcMethod("/gaugewatch.v1.HookService/Connect",
                                      grpc::internal::RpcMethod::BIDI_STREAMING),
            &context_)) {}

  bool write(const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    return stream_->Write(buffer);
  }
  grpc::Status finish() {
    stream_->WritesDone();
    grpc::ByteBuffer ignored;
    while (stream_->Read(&ignored)) {
    }
    return stream_->Finish();
  }
  grpc::ClientContext& context() { return context_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream_;
};

// Attack: 50 clients that send a header line every 0.5 s (slowloris) held
// every HTTP worker, so /healthz and /metrics timed out.
TEST(AgentHardening, HealthzAndMetricsAnswerUnderFiftySlowConnections) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  const std::uint16_t port = agent.http_port();
  std::atomic<bool> stop{false};
  std::vector<std::thread> slow;
  for (int c = 0; c < 50; ++c) {
    slow.emplace_back([&, c] {
      const int fd = tcp_connect(port);
      if (fd < 0) return;
      const std::string start = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
      (void)!::write(fd, start.data(), start.size());
      for (int line = 0; !stop.load() && line < 40; ++line) {
        const std::string header = "X-Slow-" + std::to_string(c) + ": " + std::to_string(line) + "\r\n";
        if (::write(fd, header.data(), header.size()) < 0) break;
        std::this_thread::sleep_for(milliseconds(500));
      }
      ::close(fd);
    });
  }
  std::this_thread::sleep_for(milliseconds(700));  // every slow client is connected and dribbling
  for (int probe = 0; probe < 6; ++probe) {
    const auto begin = std::chrono::steady_clock::now();
    EXPECT_EQ(http_get("127.0.0.1", port, "/healthz", "", 1500).status, 200) << "probe " << probe;
    const auto metrics = http_get("127.0.0.1", port, "/metrics", "", 1500);
    EXPECT_EQ(metrics.status, 200);
    EXPECT_NE(metrics.body.find("gaugewatch_agent_build_info"), std::string::npos);
    EXPECT_LT(std::chrono::steady_clock::now() - begin, milliseconds(1500));
    std::this_thread::sleep_for(milliseconds(400));
  }
  stop = true;
  for (auto& t : slow) t.join();
}

// Attack: HEAD returned the body.
TEST(AgentHardening, HeadAnswersHeadersOnly) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  const int fd = tcp_connect(agent.http_port());
  ASSERT_GE(fd, 0);
  const std::string request = "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string reply;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof buffer)) > 0) reply.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  ASSERT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  const auto end_of_headers = reply.find("\r\n\r\n");
  ASSERT_NE(end_of_headers, std::string::npos);
  EXPECT_EQ(reply.size(), end_of_headers + 4) << "a body followed the headers";
  std::smatch length;
  ASSERT_TRUE(std::regex_search(reply, length, std::regex("Content-Length: ([0-9]+)")));
  EXPECT_GT(std::stoul(length[1]), 1000u);  // the length GET would send
  EXPECT_EQ(http_get("127.0.0.1", agent.http_port(), "/nosuchpage").status, 404);
}

// Pages registered by other parts share the port.
TEST(AgentHardening, OtherPartsRegisterPagesOnTheOnePort) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  agent.http().register_handler("/status", [](const HttpServer::Request& request) {
    return HttpServer::Response{200, "text/html", "<p>status " + request.query + "</p>"};
  });
  const auto page = http_get("127.0.0.1", agent.http_port(), "/status?run=a");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.body, "<p>status run=a</p>");
}

// A body larger than the socket buffers (a 100k-series /metrics is ~9 MB)
// arrives whole: closing the connection must not reset it while the kernel
// still holds unsent bytes.
TEST(AgentHardening, LargeBodiesArriveWhole) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  const std::string body(16 << 20, 'm');
  agent.http().register_handler("/big", [&body](const HttpServer::Request&) {
    return HttpServer::Response{200, "text/plain", body};
  });
  for (int i = 0; i < 3; ++i) {
    const auto page = http_get("127.0.0.1", agent.http_port(), "/big");
    EXPECT_EQ(page.content_length, static_cast<long long>(body.size()));
    EXPECT_EQ(page.body.size(), body.size());
  }
}

// Attack: unparseable protobuf ended the stream with OK, counted nowhere;
// over-limit messages were counted nowhere.
TEST(AgentHardening, UnparseableAndOversizedMessagesAreRefusedAndCounted) {
  TempDir dir;
  AgentConfig config = hermetic_config(dir);
  config.limits.max_message_bytes = 64 * 1024;
  Agent agent(config);
  {
    RawStream garbage(unix_channel(config));
    garbage.write(std::string("\xff\xff\xff\xff\x0f not a protobuf", 20));
    const auto status = garbage.finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find("unparseable"), std::string::npos);
  }
  {
    RawStream big(unix_channel(config));
    v1::TrainerMessage message;
    auto hello = SimTrainer::make_hello("run-big", 0, 1, 1);
    hello.set_host(std::string(100 * 1024, 'h'));  // 100 KiB > 64 KiB
    *message.mutable_hello() = hello;
    big.write(message.SerializeAsString());
    const auto status = big.finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_NE(status.error_message().find("max_message_bytes"), std::string::npos);
  }
  const std::string text = scrape(agent);
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_messages_rejected_total{reason=\"unparseable\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_messages_rejected_total{reason=\"too_large\"} 1"));
}

// Attack: 12 samples stamped unix_time_ns=1 pushed the sample-age sum to 4.9e9 s.
TEST(AgentHardening, TimestampsOutsideTheSkewWindowAreCountedNotObserved) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  SimTrainer trainer(unix_channel(agent.config()), SimTrainer::make_hello("run-t", 0, 1, 1));
  ASSERT_TRUE(trainer.start());
  v1::SampleBatch batch;
  for (int i = 0; i < 12; ++i) {
    auto sample = SimTrainer::make_sample(static_cast<std::uint64_t>(i), 0, 0.01);
    sample.set_unix_time_ns(1);
    *batch.add_samples() = sample;
  }
  auto good = SimTrainer::make_sample(12, 0, 0.01);
  good.set_unix_time_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count());
  *batch.add_samples() = good;
  ASSERT_TRUE(trainer.send_batch(batch));
  ASSERT_TRUE(eventually([&] {
    return agent.controller().counters().samples_received_total.Value() == 13;
  }));
  const std::string text = scrape(agent);
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_samples_clock_skew_total 12")) << text;
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_sample_age_seconds_count 1"));
  EXPECT_LT(metric_value(text, "gaugewatch_agent_sample_age_seconds_sum"), 60.0);
  EXPECT_TRUE(trainer.finish().ok());
}

// Attack: 500 streams without a Hello made 1,015 threads and stayed open.
TEST(AgentHardening, StreamsAreCappedAndMustSendTheirHelloInTime) {
  TempDir dir;
  AgentConfig config = hermetic_config(dir);
  config.limits.max_streams = 3;
  config.limits.hello_timeout_seconds = 1;
  Agent agent(config);
  std::vector<std::unique_ptr<RawStream>> silent;
  for (int i = 0; i < 3; ++i) {
    silent.push_back(std::make_unique<RawStream>(unix_channel(config)));
  }
  ASSERT_TRUE(eventually([&] { return scrape(agent).find("gaugewatch_agent_connections_total 3\n") != std::string::npos; }));
  {
    RawStream fourth(unix_channel(config));
    const auto status = fourth.finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_NE(status.error_message().find("max_streams"), std::string::npos);
  }
  // The silent ones (still open, not even half-closed) are ended by the
  // Hello deadline (1 s, checked every housekeeping tick).
  ASSERT_TRUE(eventually([&] {
    return scrape(agent).find("gaugewatch_agent_streams_refused_total{reason=\"hello_deadline\"} 3\n") !=
           std::string::npos;
  }, seconds(5)));
  for (auto& stream : silent) {
    const auto status = stream->finish();
    EXPECT_FALSE(status.ok());
  }
  const std::string text = scrape(agent);
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_streams_refused_total{reason=\"stream_limit\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_streams_refused_total{reason=\"hello_deadline\"} 3")) << text;
  // With the silent streams gone, a trainer gets in.
  SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-h", 0, 1, 1));
  EXPECT_TRUE(trainer.start());
  EXPECT_TRUE(trainer.finish().ok());
}

// Attack: 60 Hellos of 4,096 layers made `gaugewatchctl layers` fail on a
// 66 MB reply; replies are now paged per rank.
TEST(AgentHardening, LayersRepliesArePaged) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  SimTrainer trainer(unix_channel(agent.config()), SimTrainer::make_hello("run-p", 0, 1, 4096));
  ASSERT_TRUE(trainer.start());
  auto admin = v1::AdminService::NewStub(unix_channel(agent.config()));
  grpc::ClientContext context;
  v1::ListRunsRequest request;
  request.set_include_layers(true);
  request.set_layer_offset(4000);
  v1::ListRunsResponse response;
  ASSERT_TRUE(admin->ListRuns(&context, request, &response).ok());
  ASSERT_EQ(response.runs_size(), 1);
  const auto& rank = response.runs(0).ranks(0);
  EXPECT_EQ(rank.layer_count(), 4096u);
  ASSERT_EQ(rank.layers_size(), 96);
  EXPECT_EQ(rank.layers(0).index(), 4000u);
  grpc::ClientContext context2;
  request.set_layer_offset(0);
  v1::ListRunsResponse first_page;
  ASSERT_TRUE(admin->ListRuns(&context2, request, &first_page).ok());
  EXPECT_EQ(first_page.runs(0).ranks(0).layers_size(), 256);
  EXPECT_TRUE(trainer.finish().ok());
}

// Attack: a second agent on the same socket path started, said "ready", and
// on exit unlinked the first agent's socket.
TEST(AgentHardening, SecondAgentOnTheSameSocketRefusesAndLeavesItAlone) {
  TempDir dir;
  const AgentConfig config = hermetic_config(dir);
  Agent first(config);
  AgentConfig second_config = config;
  second_config.database = dir.path() + "/second.db";
  try {
    Agent second(second_config);
    ADD_FAILURE() << "a second agent started on a live agent's socket";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("already running"), std::string::npos) << e.what();
  }
  // The first agent's socket is still there and still answers.
  SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-s", 0, 1, 1));
  EXPECT_TRUE(trainer.start());
  EXPECT_TRUE(trainer.finish().ok());
}

TEST(AgentHardening, AgentNeverUnlinksASocketItDidNotCreate) {
  TempDir dir;
  const AgentConfig config = hermetic_config(dir);
  auto first = std::make_unique<Agent>(config);
  // Someone removes the path and another agent binds it; the first one exits.
  ASSERT_EQ(::unlink(config.grpc_socket.c_str()), 0);
  AgentConfig second_config = config;
  second_config.database = dir.path() + "/second.db";
  Agent second(second_config);
  first.reset();
  struct stat st;
  ASSERT_EQ(::lstat(config.grpc_socket.c_str(), &st), 0) << "the second agent's socket was removed";
  SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-u", 0, 1, 1));
  EXPECT_TRUE(trainer.start());
  EXPECT_TRUE(trainer.finish().ok());
}

TEST(AgentHardening, StaleSocketIsReplaced) {
  TempDir dir;
  const AgentConfig config = hermetic_config(dir);
  {
    // A socket nobody listens on (an agent killed with -9 leaves one).
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof address.sun_path, "%s", config.grpc_socket.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
    ::close(fd);
  }
  Agent agent(config);
  SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-v", 0, 1, 1));
  EXPECT_TRUE(trainer.start());
  EXPECT_TRUE(trainer.finish().ok());
}

// Attack: the SQLite files were world-readable (0644).
TEST(AgentHardening, DatabaseFilesAreOwnerOnly) {
  TempDir dir;
  const AgentConfig config = hermetic_config(dir);
  {
    std::ofstream(config.database).put('\0');
    ::chmod(config.database.c_str(), 0644);
  }
  ::unlink(config.database.c_str());
  const mode_t old_umask = ::umask(022);
  {
    Agent agent(config);
    auto admin = v1::AdminService::NewStub(unix_channel(config));
    SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-m", 0, 1, 2));
    ASSERT_TRUE(trainer.start());
    grpc::ClientContext context;
    v1::SetBackendRequest request;
    request.mutable_target()->set_run_id("run-m");
    request.set_backend(v1::BACKEND_GPROJ);
    v1::SetBackendResponse response;
    ASSERT_TRUE(admin->SetBackend(&context, request, &response).ok());
    for (const char* suffix : {"", "-wal", "-shm"}) {
      struct stat st;
      const std::string path = config.database + suffix;
      ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
      EXPECT_EQ(st.st_mode & 0777, 0600u) << path;
    }
    EXPECT_TRUE(trainer.finish().ok());
  }
  ::umask(old_umask);
}

// Attack: unix-socket admin calls were audited as "admin unix:" with no caller.
TEST(AgentHardening, UnixCallersAreIdentifiedByUidAndPid) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  SimTrainer trainer(unix_channel(agent.config()), SimTrainer::make_hello("run-w", 0, 1, 2));
  ASSERT_TRUE(trainer.start());
  std::ostringstream out, err;
  ASSERT_EQ(run_ctl({"switch", "--socket", agent.config().grpc_socket, "--run", "run-w", "--backend", "gproj"},
                    out, err, [](const char*) -> const char* { return nullptr; }),
            kCtlOk)
      << err.str();
  auto admin = v1::AdminService::NewStub(unix_channel(agent.config()));
  grpc::ClientContext context;
  v1::ListDecisionsRequest request;
  v1::ListDecisionsResponse response;
  ASSERT_TRUE(admin->ListDecisions(&context, request, &response).ok());
  ASSERT_EQ(response.decisions_size(), 1);
  const std::string expected =
      "admin unix uid=" + std::to_string(::getuid()) + " pid=" + std::to_string(::getpid());
  EXPECT_EQ(response.decisions(0).rule(), expected);
  EXPECT_TRUE(trainer.finish().ok());
}

// Attack: `switch --run nosuchrun` and `--layers 5` on a 2-layer run stored
// decisions and exited 0.
TEST(AgentHardening, UnknownRunsRanksAndLayersAreRefused) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  SimTrainer trainer(unix_channel(agent.config()), SimTrainer::make_hello("run-x", 0, 1, 2));
  ASSERT_TRUE(trainer.start());
  const auto env = [](const char*) -> const char* { return nullptr; };
  const std::string socket = agent.config().grpc_socket;
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"switch", "--socket", socket, "--run", "nosuchrun", "--backend", "gproj"}, "not known"},
      {{"switch", "--socket", socket, "--run", "run-x", "--rank", "3", "--backend", "gproj"}, "no rank 3"},
      {{"switch", "--socket", socket, "--run", "run-x", "--layers", "5", "--backend", "gproj"}, "out of range"},
      {{"capture", "--socket", socket, "--run", "run-x", "--layer", "2"}, "out of range"},
      {{"sampling", "--socket", socket, "--run", "nosuchrun", "--every", "5"}, "not known"},
  };
  for (const auto& c : cases) {
    std::ostringstream out, err;
    EXPECT_EQ(run_ctl(c.args, out, err, env), kCtlRpcError) << c.args[4];
    EXPECT_NE(err.str().find(c.says), std::string::npos) << err.str();
  }
  auto admin = v1::AdminService::NewStub(unix_channel(agent.config()));
  grpc::ClientContext context;
  v1::ListDecisionsRequest request;
  v1::ListDecisionsResponse response;
  ASSERT_TRUE(admin->ListDecisions(&context, request, &response).ok());
  EXPECT_EQ(response.decisions_size(), 0);
  EXPECT_TRUE(trainer.finish().ok());
}

// Attack: a capture's ack was recorded as "unknown command" and counted both
// applied and unknown.
TEST(AgentHardening, CaptureAcksAreMatchedToTheirCommand) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  SimTrainer trainer(unix_channel(agent.config()), SimTrainer::make_hello("run-c", 0, 1, 4));
  ASSERT_TRUE(trainer.start());
  std::ostringstream out, err;
  ASSERT_EQ(run_ctl({"capture", "--socket", agent.config().grpc_socket, "--run", "run-c", "--layer", "1"},
                    out, err, [](const char*) -> const char* { return nullptr; }),
            kCtlOk)
      << err.str();
  const auto commands = trainer.wait_commands(1, seconds(10));
  ASSERT_EQ(commands.size(), 1u);
  ASSERT_TRUE(commands[0].has_capture());
  ASSERT_TRUE(trainer.ack(commands[0].command_id(), true, 7));
  ASSERT_TRUE(trainer.ack(999999, true, 7));  // a command never sent
  ASSERT_TRUE(eventually([&] {
    return scrape(agent).find("gaugewatch_agent_command_acks_total{status=\"unknown\"} 1\n") != std::string::npos;
  }));
  const std::string text = scrape(agent);
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_command_acks_total{status=\"applied\"} 1")) << text;
  EXPECT_TRUE(trainer.finish().ok());
}

// Attack: gaugewatchctl aborted (SIGABRT inside gRPC) on a token file ending in CRLF.
TEST(AgentHardening, TokenFilesWithCrlfAreAccepted) {
  TempDir dir;
  const std::string path = dir.path() + "/token";
  std::ofstream(path) << "s3cret-token\r\n";
  // gaugewatchctl reads it (a status call to a socket nobody listens on fails
  // with an RPC error, not an abort or a usage error about the token).
  std::ostringstream out, err;
  EXPECT_EQ(run_ctl({"status", "--socket", dir.path() + "/none.sock", "--token-file", path, "--timeout", "1"},
                    out, err, [](const char*) -> const char* { return nullptr; }),
            kCtlRpcError)
      << err.str();
  // The agent reads it the same way.
  CommandLine command_line;
  const AgentConfig config = load_config({"--admin-token-file", path},
                                         [](const char*) -> const char* { return nullptr; }, command_line);
  EXPECT_EQ(config.admin_token, "s3cret-token");
  std::ofstream(path) << "two words\n";
  std::ostringstream out2, err2;
  EXPECT_EQ(run_ctl({"status", "--token-file", path}, out2, err2,
                    [](const char*) -> const char* { return nullptr; }),
            kCtlUsage);
  EXPECT_NE(err2.str().find("printable ASCII"), std::string::npos) << err2.str();
}

}  // namespace
}  // namespace gaugewatch::agent
