#include "actors/wire.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/timestamp.hpp>
#include <chrono>
#include <fstream>
#include <memory>

#include "actors/draft_worker.hpp"
#include "actors/gate.hpp"
#include "config/error.hpp"
#include "config/input.hpp"

namespace specactor::actors {

std::vector<WorkerAddress> parse_workers(const std::string& list, const std::string& flag) {
  std::vector<WorkerAddress> out;
  for (auto& [host, port] : config::parse_addresses(list, flag)) out.push_back({std::move(host), port});
  return out;
}

std::string model_identity(const model::ModelInfo& info) {
  nlohmann::json j = info.to_json();
  j.erase("path");
  return j.dump();
}

namespace {

// OpenSSL's reason for the last failure (its queue emptied), or `fallback`.
std::string openssl_reason(const char* fallback) {
  std::string why;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    why = buf;  // the last one is the most specific
  }
  return why.empty() ? fallback : why;
}

// No passphrase prompt on the terminal: an encrypted key is refused.
int no_passphrase(char*, int, int, void*) { return 0; }

}  // namespace

void check_tls(const TlsFiles& tls, const std::string& prefix) {
  if (!tls.on()) return;
  const std::string cert = prefix + "certificate", key = prefix + "key", ca = prefix + "ca";
  // PEM files are a few KiB: each is read here, bounded, and must be a regular file (a FIFO would
  // block the start; a directory or an empty file would only fail at the first connection).
  const std::pair<const std::string*, const std::string*> files[] = {
      {&cert, &tls.certificate}, {&key, &tls.key}, {&ca, &tls.ca}};
  for (auto [flag, path] : files)  // all three named before any is read
    if (path->empty())
      throw config::ConfigError(*flag + ": is required with the other TLS flags (" + cert + ", " + key + " and " + ca +
                                ": all three or none)");
  std::string text[3];
  int i = 0;
  for (auto [flag, path] : files) {
    const std::string what = *flag + " " + config::printable(*path);
    text[i] = config::read_text_file(*path, what, kMaxPemBytes);
    if (text[i].find("-----BEGIN ") == std::string::npos)
      throw config::ConfigError(what + ": not a PEM file (expected a '-----BEGIN ...' block)");
    ++i;
  }
  // Loaded as the TLS layer will load them at each connection, so a bad file stops the start with its
  // flag named instead of the first connection.
  ERR_clear_error();
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_method()), &SSL_CTX_free);
  if (!ctx) throw config::ConfigError("TLS: cannot create an OpenSSL context: " + openssl_reason("unknown error"));
  SSL_CTX_set_default_passwd_cb(ctx.get(), &no_passphrase);
  const std::string cert_what = cert + " " + config::printable(tls.certificate);
  const std::string key_what = key + " " + config::printable(tls.key);
  const std::string ca_what = ca + " " + config::printable(tls.ca);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), tls.certificate.c_str()) != 1)
    throw config::ConfigError(cert_what + ": not a usable PEM certificate (" + openssl_reason("no certificate") + ")");
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), tls.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string why = openssl_reason("no key");
    if (why.find("mismatch") != std::string::npos)  // a key, but of another pair
      throw config::ConfigError(key_what + ": does not match the certificate " + cert_what + " (" + why + ")");
    throw config::ConfigError(key_what + ": not a usable unencrypted PEM private key (" + why + ")");
  }
  if (SSL_CTX_check_private_key(ctx.get()) != 1)
    throw config::ConfigError(key_what + ": does not match the certificate " + cert_what + " (" +
                              openssl_reason("another key pair") + ")");
  if (SSL_CTX_load_verify_locations(ctx.get(), tls.ca.c_str(), nullptr) != 1)
    throw config::ConfigError(ca_what + ": holds no usable PEM certificate (" + openssl_reason("no certificate") + ")");
  ERR_clear_error();
}

namespace {

// The middleman's connect, with the gate's challenge answered before the socket becomes CAF's.
class SecretConnector final : public caf::io::middleman_actor_impl {
 public:
  SecretConnector(caf::actor_config& cfg, caf::actor broker, std::string secret)
      : middleman_actor_impl(cfg, std::move(broker)), secret_(std::move(secret)) {}
  const char* name() const override { return "specactor.secret_connector"; }

 protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, std::uint16_t port) override {
    const std::string where = host + ":" + std::to_string(port);
    std::string why;
    const int fd = dial(host, port, 5, why);
    if (fd < 0) return caf::make_error(caf::sec::cannot_connect_to_node, where + ": " + why);
    why = prove_secret(fd, secret_, 5);
    if (!why.empty()) {
      ::close(fd);
      return caf::make_error(caf::sec::cannot_connect_to_node, where + ": " + why);
    }
    return system().middleman().backend().new_scribe(fd);
  }

 private:
  std::string secret_;
};

}  // namespace

caf::io::middleman_actor spawn_secret_connector(caf::actor_system& system, std::string secret) {
  auto basp = system.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  return system.spawn<SecretConnector, caf::detached + caf::hidden>(std::move(basp), std::move(secret));
}

std::string client_secret(const std::string& file, const std::string& flag) {
  if (file == "none") return {};
  return load_secret(file.empty() ? default_secret_file() : file, flag, false);
}

void configure_network(caf::actor_system_config& cfg, const TlsFiles& tls, std::int64_t heartbeat_ms,
                       std::int64_t timeout_ms) {
  cfg.load<caf::io::middleman>();
  if (tls.on()) {
    cfg.openssl_certificate = tls.certificate;
    cfg.openssl_key = tls.key;
    cfg.openssl_cafile = tls.ca;
    cfg.load<caf::openssl::manager>();
  }
  cfg.add_message_type<GenerationRequest>("specactor::generation_request");
  cfg.add_message_type<TokenEvent>("specactor::token_event");
  cfg.add_message_type<EngineMetrics>("specactor::engine_metrics");
  cfg.add_message_type<ReplicaInfo>("specactor::replica_info");
  cfg.add_message_type<config::Snapshot>("specactor::snapshot");
  cfg.add_message_type<ProposeBatch>("specactor::propose_batch");
  cfg.add_message_type<Proposals>("specactor::proposals");
  cfg.add_message_type<DrafterNeeds>("specactor::drafter_needs");
  cfg.add_message_type<draft_worker_actor>("specactor::draft_worker_actor");
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(heartbeat_ms)});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(timeout_ms)});
}

}  // namespace specactor::actors
