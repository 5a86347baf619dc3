// tests/test_gate.cpp — the byte path in front of a worker's CAF port (actors/gate.hpp), without CAF:
// a fake "inner" port records what the gate lets through. The cluster secret's challenge, frames
// checked before their payload is kept, deadlines for held connections and slow frames, the
// connection limit; the secret file's rules; the TLS files checked at start (check_tls).
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/gate.hpp"
#include "actors/wire.hpp"
#include "config/error.hpp"

using namespace specactor;
using namespace specactor::actors;
namespace fs = std::filesystem;

namespace {

// A loopback listener that greets each connection (as CAF's server handshake would) and keeps
// every byte it receives.
struct Inner {
  int fd = -1;
  std::uint16_t port = 0;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::string got;
  std::atomic<int> connections{0};
  std::thread thread;

  Inner() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 64) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    thread = std::thread([this] { run(); });
  }
  ~Inner() {
    stop = true;
    thread.join();
    ::close(fd);
  }
  void run() {
    std::vector<pollfd> fds{{fd, POLLIN, 0}};
    while (!stop) {
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int c = ::accept(fd, nullptr, nullptr);
        if (c >= 0) {
          ++connections;
          const std::string hello = "HELLO";
          [[maybe_unused]] const auto w = ::send(c, hello.data(), hello.size(), MSG_NOSIGNAL);
          fds.push_back({c, POLLIN, 0});
        }
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        char buf[4096];
        const ssize_t n = ::recv(fds[i].fd, buf, sizeof buf, 0);
        if (n > 0) {
          std::lock_guard<std::mutex> lock(mu);
          got.append(buf, static_cast<std::size_t>(n));
        } else {
          ::close(fds[i].fd);
          fds[i].fd = -1;
        }
      }
      std::erase_if(fds, [](const pollfd& p) { return p.fd < 0; });
    }
    for (std::size_t i = 1; i < fds.size(); ++i) ::close(fds[i].fd);
  }
  std::string received() {
    std::lock_guard<std::mutex> lock(mu);
    return got;
  }
};

int dial_gate(std::uint16_t port) {
  std::string why;
  const int fd = dial("127.0.0.1", port, 5, why);
  REQUIRE_MESSAGE(fd >= 0, why);
  return fd;
}

void send_all(int fd, const std::string& s) {
  std::size_t at = 0;
  while (at < s.size()) {
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, 1000);
    const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;  // the gate closed it
    at += static_cast<std::size_t>(n);
  }
}

// Reads until the gate closes the connection (true) or `seconds` pass (false); the bytes go to `out`.
bool closed_within(int fd, double seconds, std::string* out = nullptr) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    if (n > 0 && out) out->append(buf, static_cast<std::size_t>(n));
  }
  return false;
}

// A BASP-shaped frame: operation, 2 padding bytes, flags, 32-bit big-endian length, 24 bytes, payload.
std::string frame(std::uint8_t op, std::uint32_t len, std::size_t payload_bytes) {
  std::string f(32, '\0');
  f[0] = static_cast<char>(op);
  f[4] = static_cast<char>(len >> 24);
  f[5] = static_cast<char>(len >> 16);
  f[6] = static_cast<char>(len >> 8);
  f[7] = static_cast<char>(len);
  f += std::string(payload_bytes, 'p');
  return f;
}

template <class F>
bool eventually(F f, double seconds = 3) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return f();
}

const std::string kSecret = "0123456789abcdef0123456789abcdef";

}  // namespace

TEST_CASE("gate: the secret is proven before a byte reaches the inner port, a wrong answer is closed") {
  Inner inner;
  GateOptions o;
  o.secret = kSecret;
  auto gate = Gate::open("127.0.0.1", 0, inner.port, o);
  // A wrong answer: closed, and the inner port never saw a connection.
  const int bad = dial_gate(gate->port());
  std::string challenge;
  CHECK_FALSE(closed_within(bad, 0.3, &challenge));
  send_all(bad, std::string(32, 'x'));
  CHECK(closed_within(bad, 3));
  ::close(bad);
  CHECK(challenge.size() == 48);
  CHECK(static_cast<unsigned char>(challenge[0]) == 0xff);  // a plain CAF client takes it for a bad frame
  CHECK(gate->stats().refused_secret == 1);
  // Another secret: refused with a clear reason.
  const int other = dial_gate(gate->port());
  CHECK(prove_secret(other, "another secret, also long enough", 3).find("refused") != std::string::npos);
  ::close(other);
  CHECK(inner.connections == 0);
  // The right one: the inner port's greeting comes through, then whole frames go in.
  const int good = dial_gate(gate->port());
  CHECK(prove_secret(good, kSecret, 3) == "");
  std::string hello;
  CHECK_FALSE(closed_within(good, 0.3, &hello));
  CHECK(hello == "HELLO");
  const std::string handshake = frame(1, 10, 10);
  send_all(good, handshake);
  CHECK(eventually([&] { return inner.received() == handshake; }));
  // A frame arrives in pieces: nothing of it goes in until it is whole.
  const std::string msg = frame(2, 100, 100);
  send_all(good, msg.substr(0, 50));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(inner.received() == handshake);
  send_all(good, msg.substr(50));
  CHECK(eventually([&] { return inner.received() == handshake + msg; }));
  // A header announcing ~4 GiB: closed before anything of it is kept or passed on.
  send_all(good, frame(1, 0xFFFFFFF0u, 0));
  CHECK(closed_within(good, 3));
  ::close(good);
  CHECK(gate->stats().refused_oversized == 1);
  CHECK(inner.received() == handshake + msg);
  CHECK(eventually([&] { return gate->stats().open == 0; }));
}

TEST_CASE(
    "gate without a secret: frames checked, garbage and a server handshake refused, deadlines close held connections") {
  Inner inner;
  GateOptions o;  // no secret: the worker's --insecure
  o.handshake_timeout_s = 0.4;
  o.frame_timeout_s = 0.4;
  o.max_frame_bytes = 1000;
  auto gate = Gate::open("127.0.0.1", 0, inner.port, o);
  // The oversized frame of the probe, at this gate's limit of 1000 bytes.
  int c = dial_gate(gate->port());
  send_all(c, frame(1, 1001, 0));
  CHECK(closed_within(c, 2));
  ::close(c);
  // Not BASP: random bytes; a server handshake (operation 0) from a peer, which crashed CAF 0.17.
  for (const std::string& junk : {std::string(64, '\x7f'), frame(0, 0, 0), frame(2, 0, 0)}) {
    c = dial_gate(gate->port());
    send_all(c, junk);
    CHECK(closed_within(c, 2));
    ::close(c);
  }
  CHECK(gate->stats().refused_oversized == 1);
  CHECK(gate->stats().refused_garbage == 3);
  // Held connections: nothing sent, or a frame left unfinished.
  const int idle = dial_gate(gate->port());
  const int slow = dial_gate(gate->port());
  send_all(slow, frame(1, 0, 0) + frame(2, 500, 10));
  CHECK(closed_within(idle, 2));
  CHECK(closed_within(slow, 2));
  ::close(idle);
  ::close(slow);
  CHECK(gate->stats().timed_out == 2);
  CHECK(inner.received() == frame(1, 0, 0));  // only the whole frame went in
  CHECK(eventually([&] { return gate->stats().open == 0 && gate->stats().buffered_bytes == 0; }));
}

TEST_CASE("gate: connections beyond the limit are closed at once, the others served") {
  Inner inner;
  GateOptions o;
  o.max_connections = 2;
  auto gate = Gate::open("127.0.0.1", 0, inner.port, o);
  const int a = dial_gate(gate->port());
  const int b = dial_gate(gate->port());
  CHECK(eventually([&] { return gate->stats().open == 2; }));
  const int c = dial_gate(gate->port());
  CHECK(closed_within(c, 2));
  CHECK(gate->stats().refused_full == 1);
  send_all(a, frame(1, 3, 3));
  CHECK(eventually([&] { return inner.received() == frame(1, 3, 3); }));
  for (int fd : {a, b, c}) ::close(fd);
  // A port another process holds is refused, naming the flag.
  CHECK_THROWS_WITH_AS(Gate::open("127.0.0.1", gate->port(), inner.port, o), doctest::Contains("--port: cannot listen"),
                       config::ConfigError);
}

TEST_CASE(
    "cluster secret file: made mode 600 when missing, refused when others may read it, too short, or not a file") {
  const fs::path dir = fs::temp_directory_path() / ("specactor_secret." + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string path = (dir / "sub" / "cluster-secret").string();
  const std::string made = load_secret(path, "--secret-file", true);
  CHECK(made.size() == 64);
  CHECK((fs::status(path).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));
  CHECK(load_secret(path, "--secret-file", true) == made);  // kept, not made again
  fs::permissions(path, fs::perms::group_read, fs::perm_options::add);
  CHECK_THROWS_WITH_AS(load_secret(path, "--secret-file", false),
                       doctest::Contains("other users may read or change it (mode 640); chmod 600 it"),
                       config::ConfigError);
  const std::string shorter = (dir / "short").string();
  std::ofstream(shorter) << "tooshort\n";
  fs::permissions(shorter, fs::perms::owner_read | fs::perms::owner_write);
  CHECK_THROWS_WITH_AS(load_secret(shorter, "--worker-secret-file", false),
                       doctest::Contains(("--worker-secret-file " + shorter + ": a secret of at least 16").c_str()),
                       config::ConfigError);
  const std::string pipe = (dir / "pipe").string();
  REQUIRE(::mkfifo(pipe.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(load_secret(pipe, "--secret-file", false), doctest::Contains("not a regular file"),
                       config::ConfigError);
  CHECK_THROWS_WITH_AS(load_secret((dir / "missing").string(), "--secret-file", false),
                       doctest::Contains("no such file (a worker makes it when it first starts"), config::ConfigError);
  CHECK(client_secret("none", "--worker-secret-file").empty());
  fs::remove_all(dir);
}

TEST_CASE("TLS files are loaded and matched at start: each bad one named by its flag, a FIFO does not hang") {
  const fs::path dir = fs::temp_directory_path() / ("specactor_tls." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto f = [&](const std::string& n) { return (dir / n).string(); };
  auto openssl = [&](const std::string& args) {
    return std::system(("cd " + dir.string() + " && openssl " + args + " >/dev/null 2>&1").c_str()) == 0;
  };
  REQUIRE(openssl("req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=ca"));
  REQUIRE(openssl("req -newkey rsa:2048 -nodes -keyout w.key -out w.csr -subj /CN=w"));
  REQUIRE(openssl("x509 -req -in w.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out w.pem -days 2"));
  REQUIRE(openssl("genrsa -out other.key 2048"));
  REQUIRE(::mkfifo(f("fifo").c_str(), 0600) == 0);
  std::ofstream(f("empty.pem")).flush();
  std::ofstream(f("bad64.pem")) << "-----BEGIN CERTIFICATE-----\n!!!! not base64 !!!!\n-----END CERTIFICATE-----\n";
  CHECK_NOTHROW(check_tls({f("w.pem"), f("w.key"), f("ca.pem")}, "--tls-"));
  struct Case {
    TlsFiles files;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"/etc/passwd", "/etc/passwd", "/etc/passwd"}, "--tls-certificate /etc/passwd: not a PEM file"},
      {{f("w.pem"), dir.string(), f("ca.pem")}, "--tls-key " + dir.string() + ": not a regular file"},
      {{f("w.pem"), f("w.key"), dir.string()}, "--tls-ca " + dir.string() + ": not a regular file"},
      {{f("fifo"), f("w.key"), f("ca.pem")}, "--tls-certificate " + f("fifo") + ": not a regular file"},
      {{f("empty.pem"), f("w.key"), f("ca.pem")}, "--tls-certificate " + f("empty.pem") + ": not a PEM file"},
      {{f("bad64.pem"), f("w.key"), f("ca.pem")}, "--tls-certificate " + f("bad64.pem") + ": not a usable PEM"},
      {{f("w.pem"), f("other.key"), f("ca.pem")}, "--tls-key " + f("other.key") + ": does not match the certificate"},
      {{f("w.pem"), f("w.key"), f("w.key")}, "--tls-ca " + f("w.key") + ": holds no usable PEM certificate"},
      {{f("w.pem"), "", f("ca.pem")}, "--tls-key: is required with the other TLS flags"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.want);
    CHECK_THROWS_WITH_AS(check_tls(c.files, "--tls-"), doctest::Contains(c.want.c_str()), config::ConfigError);
  }
  fs::remove_all(dir);
}
