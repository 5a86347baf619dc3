// drafters/registry.cpp — the algorithm-name → factory registry; built-ins are registered explicitly.
#include <map>
#include <mutex>
#include <stdexcept>

#include "config/error.hpp"
#include "config/input.hpp"
#include "drafters/drafter.hpp"

namespace specactor::drafters {

std::unique_ptr<Drafter> make_ngram_drafter(const config::Snapshot& snapshot, const DraftContext& context);
std::unique_ptr<Drafter> make_suffix_drafter(const config::Snapshot& snapshot, const DraftContext& context);
std::unique_ptr<Drafter> make_standalone_drafter(const config::Snapshot& snapshot, const DraftContext& context);
std::unique_ptr<Drafter> make_eagle_drafter(const config::Snapshot& snapshot, const DraftContext& context);
std::unique_ptr<Drafter> make_eagle3_drafter(const config::Snapshot& snapshot, const DraftContext& context);
std::unique_ptr<Drafter> make_mtp_drafter(const config::Snapshot& snapshot, const DraftContext& context);
std::unique_ptr<Drafter> make_frozen_kv_mtp_drafter(const config::Snapshot& snapshot, const DraftContext& context);
std::unique_ptr<Drafter> make_dflash_drafter(const config::Snapshot& snapshot, const DraftContext& context);

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, DrafterFactory> factories;
  Registry() {  // built-ins, registered explicitly (static libraries drop self-registering objects)
    factories["NGRAM"] = &make_ngram_drafter;
    factories["SUFFIX"] = &make_suffix_drafter;
    factories["STANDALONE"] = &make_standalone_drafter;
    factories["EAGLE"] = &make_eagle_drafter;
    factories["EAGLE3"] = &make_eagle3_drafter;
    factories["MTP"] = &make_mtp_drafter;
    factories["FROZEN_KV_MTP"] = &make_frozen_kv_mtp_drafter;
    factories["DFLASH"] = &make_dflash_drafter;
    factories["DSPARK"] = &make_dflash_drafter;  // the same drafter: the checkpoint says which heads follow
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

DraftTree DraftTree::chain(std::vector<std::int32_t> tokens) {
  DraftTree t;
  t.parents.resize(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) t.parents[i] = static_cast<std::int32_t>(i) - 1;
  t.tokens = std::move(tokens);
  return t;
}

void register_drafter(const std::string& algorithm, DrafterFactory factory) {
  const auto name = config::Algorithm::parse(algorithm);
  if (!name || *name == config::SpecAlgorithm::None || *name == config::SpecAlgorithm::Auto)
    throw std::invalid_argument("register_drafter: '" + config::printable(algorithm) +
                                "' is not a drafter name (a letter, then letters, digits or _; not NONE or AUTO)");
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.factories[name->name()] = std::move(factory);
}

namespace {

std::string unregistered(const std::string& algo, Registry& r) {
  std::string known;
  for (const auto& [name, f] : r.factories) known += (known.empty() ? "" : ", ") + name;
  return "--speculative-algorithm " + algo + ": no drafter is registered under this name (registered: " + known + ")";
}

}  // namespace

DrafterFactory find_drafter(const std::string& algorithm) {
  const auto parsed = config::Algorithm::parse(algorithm);
  const std::string algo = parsed ? parsed->name() : algorithm;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.factories.find(algo);
  if (it == r.factories.end()) throw std::runtime_error(unregistered(config::printable(algo), r));
  return it->second;
}

DrafterFactory find_drafter(const config::Snapshot& draft_snapshot) {
  return find_drafter(draft_snapshot->speculative_algorithm.name());
}

void check_registered(const config::ServerArgs& args) {
  const config::Algorithm& a = args.speculative_algorithm;
  if (a == config::SpecAlgorithm::None || a == config::SpecAlgorithm::Auto) return;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (!r.factories.count(a.name())) throw config::ConfigError(unregistered(a.name(), r));
}

std::vector<std::string> registered_drafters() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> out;
  for (const auto& [name, f] : r.factories) out.push_back(name);
  return out;
}

}  // namespace specactor::drafters
