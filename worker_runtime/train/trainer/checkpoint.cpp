// Starting from and writing snapshots, and in-place recovery's state (see checkpoint.hpp); then
// the training run's own snapshot, stop and heal steps (Run's, run.hpp).
#include "checkpoint.hpp"

#include <algorithm>
#include <cstddef>
#include <csignal>
#include <thread>
#include <iostream>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "run.hpp"
#include "shard_copies.hpp"
#include "shard_snapshot.hpp"

namespace ddp::train {
namespace {

// A snapshot that cannot go into this run: another model (the slot sizes are checked by the
// reader), another optimizer.
void check_fits(const SnapshotReader& r, const TrainOptions& o, const Optimizer& opt,
                const std::string& path) {
  const SnapshotHeader& h = r.header();
  if (model_named(h.model) != o.model) {
    throw ConfigError("snapshot " + path + " holds model '" + h.model + "'; this run trains '" +
                      to_string(o.model) + "' (remove the file or pass another --snapshot)");
  }
  if (optimizer_named(h.optimizer) != opt.config().kind || r.pieces() != state_pieces(opt)) {
    throw ConfigError("snapshot " + path + " was written with --optimizer " + h.optimizer +
                      "; this run uses " + to_string(opt.config().kind));
  }
}

SnapshotHeader header_at(const TrainOptions& o, const TrainContext& c, const Position& at,
                         const Optimizer& opt) {
  SnapshotHeader h;
  h.model = to_string(o.model);
  h.optimizer = to_string(opt.config().kind);
  h.epoch = at.epoch;
  h.step = at.step;
  h.global_step = at.global_step;
  h.adam_t = opt.steps();
  h.seed = o.seed;
  h.lr = opt.config().lr;
  h.world_size = c.world;
  h.batch_size = o.batch_size;
  return h;
}

// A replicated engine: rank 0 reads (any format, any world) and broadcasts.
std::optional<Position> load_replicated(Engine& e, const TrainOptions& o, const TrainContext& c) {
  Model& model = e.model();
  Optimizer& opt = e.optimizer();
  model.init(o.seed);
  std::int64_t head[5] = {0, 0, 0, 0, 0};  // has, epoch, step, global_step, adam_t
  if (c.rank == 0 && !o.snapshot.empty()) {
    if (auto r = SnapshotReader::open(o.snapshot, model.slots())) {
      check_fits(*r, o, opt, o.snapshot);
      const ShardLayout whole = make_shard_layout(model.slots(), 1, 0);  // the flat layout
      r->read_shard(whole, model.params().data(),
                    opt.state().empty() ? nullptr : opt.state().data());
      const auto& h = r->header();
      head[0] = 1;
      head[1] = h.epoch;
      head[2] = h.step;
      head[3] = h.global_step;
      head[4] = h.adam_t;
    }
  }
  if (c.comm != nullptr) {
    c.comm->broadcast(head, sizeof head, 0);
    c.comm->broadcast(model.params().data(), model.param_count() * sizeof(float), 0);
    if (head[0] != 0 && !opt.state().empty()) {
      c.comm->broadcast(opt.state().data(), opt.state().size() * sizeof(float), 0);
    }
  }
  e.upload();
  if (head[0] == 0) return std::nullopt;
  opt.set_steps(head[4]);
  return Position{head[1], head[2], head[3]};
}

}  // namespace

PeerState sync_from_peer(Engine& e, worker::Communicator& comm, std::optional<Position> mine) {
  const std::int64_t held = mine ? mine->global_step : -1;
  std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&held, all.data(), sizeof held);
  std::size_t root = 0;
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] > all[root]) root = r;
  }
  if (all[root] < 0) throw ProtocolError("in-place recovery: no rank holds the training state");
  Model& model = e.model();
  Optimizer& opt = e.optimizer();
  std::int64_t head[4] = {0, 0, 0, 0};  // epoch, step, global_step, adam_t
  if (static_cast<std::size_t>(comm.rank()) == root) {
    e.download();
    head[0] = mine->epoch;
    head[1] = mine->step;
    head[2] = mine->global_step;
    head[3] = opt.steps();
  }
  const int from = static_cast<int>(root);
  comm.broadcast(head, sizeof head, from);
  comm.broadcast(model.params().data(), model.param_count() * sizeof(float), from);
  if (!opt.state().empty()) {
    comm.broadcast(opt.state().data(), opt.state().size() * sizeof(float), from);
  }
  e.upload();
  opt.set_steps(head[3]);
  return {Position{head[0], head[1], head[2]}, from};
}

namespace {

// Floats of rank q's shard with its optimizer state.
std::size_t shard_floats(const ShardLayout& l, const Optimizer& opt, int q) {
  std::size_t n = 0;
  for (const auto& c : l.counts) n += c[static_cast<std::size_t>(q)];
  return n * static_cast<std::size_t>(1 + state_pieces(opt));
}

}  // namespace

void keep_shard_copy(Engine& e, worker::Communicator& comm, ShardCopies& copies,
                     const Position& at) {
  const ShardLayout& l = *e.shard_layout();
  const Optimizer& opt = e.optimizer();
  const float* p = e.shard_params();
  std::vector<float> state(p, p + l.shard_size);
  state.insert(state.end(), opt.state().begin(), opt.state().end());
  const int prev = (comm.rank() + comm.size() - 1) % comm.size();
  copies.keep(comm, {at.epoch, at.step, at.global_step, opt.steps()}, std::move(state),
              shard_floats(l, opt, prev));
}

PeerState heal_shards(Engine& e, worker::Communicator& comm, ShardCopies& copies,
                      bool replacement) {
  const ShardLayout& l = *e.shard_layout();
  Optimizer& opt = e.optimizer();
  ShardCopies::Healed got = copies.heal(comm, replacement, shard_floats(l, opt, comm.rank()));
  if (got.state.size() != l.shard_size + opt.state().size()) {
    throw ProtocolError("in-place recovery: rank " + std::to_string(got.from) + " sent " +
                        std::to_string(got.state.size()) + " floats for a shard of " +
                        std::to_string(l.shard_size + opt.state().size()));
  }
  std::copy_n(got.state.data(), l.shard_size, e.shard_params());
  std::copy(got.state.begin() + static_cast<std::ptrdiff_t>(l.shard_size), got.state.end(),
            opt.state().begin());
  opt.set_steps(got.head[3]);
  e.upload();  // the replicated levels gather the full parameters (collective)
  const Position at{got.head[0], got.head[1], got.head[2]};
  keep_shard_copy(e, comm, copies, at);  // the replacement's copies, over the new communicator
  return {at, got.from};
}

namespace {

// A sharded engine: every rank reads its own slices (rank 0 says first whether there is a
// snapshot, so that every rank takes the same branch), or initialises its shard.
std::optional<Position> load_sharded(Engine& e, const TrainOptions& o, const TrainContext& c) {
  const ShardLayout& layout = *e.shard_layout();
  Optimizer& opt = e.optimizer();
  float* state = opt.state().empty() ? nullptr : opt.state().data();
  std::int64_t has = 0;
  if (c.rank == 0 && !o.snapshot.empty()) {
    has = std::filesystem::exists(o.snapshot) ? 1 : 0;  // every rank's open() checks it
  }
  if (c.comm != nullptr) c.comm->broadcast(&has, sizeof has, 0);
  if (has == 0) {
    const ModelSpec& spec = e.model().spec();
    float* shard = e.shard_params();
    for (std::size_t k = 0; k < layout.slots.size(); ++k) {
      init_slice(spec, o.seed, k, layout.lo[k], layout.hi[k], shard + layout.local[k]);
    }
    e.upload();
    return std::nullopt;
  }
  auto r = SnapshotReader::open(o.snapshot, layout.slots);
  if (!r) {
    throw ConfigError("snapshot " + o.snapshot + ": rank " + std::to_string(c.rank) +
                      " does not see the file rank 0 read; with --sharding every rank reads its "
                      "own part, so the snapshot must be in a folder every node sees");
  }
  check_fits(*r, o, opt, o.snapshot);
  r->read_shard(layout, e.shard_params(), state);
  e.upload();
  const auto& h = r->header();
  opt.set_steps(h.adam_t);
  return Position{h.epoch, h.step, h.global_step};
}

}  // namespace

int state_pieces(const Optimizer& opt) {
  switch (opt.config().kind) {
    case OptimizerKind::sgd: return opt.config().momentum != 0.0f ? 1 : 0;
    case OptimizerKind::adam:
    case OptimizerKind::adamw: return 2;
    case OptimizerKind::adadelta: return 2;
  }
  return 0;
}

std::optional<Position> load_or_init(Engine& engine, const TrainOptions& o, const TrainContext& c) {
  return engine.shard_layout() != nullptr ? load_sharded(engine, o, c)
                                          : load_replicated(engine, o, c);
}

void save_snapshot(Engine& engine, const TrainOptions& o, const TrainContext& c,
                   const Position& at) {
  const Optimizer& opt = engine.optimizer();
  const ShardLayout* layout = engine.shard_layout();
  if (layout == nullptr) {
    if (c.rank != 0) return;
    engine.download();
    Snapshot s;
    s.header = header_at(o, c, at, opt);
    s.params = engine.model().params();
    s.opt_state = opt.state();
    write_snapshot_file(o.snapshot, s);
    return;
  }
  engine.download();  // a device's shard and optimizer state to shard_params(), state()
  const SnapshotHeader h = header_at(o, c, at, opt);
  const int pieces = state_pieces(opt);
  const std::uint64_t mine =
      write_shard_file(o.snapshot, h, *layout, engine.shard_params(),
                       opt.state().empty() ? nullptr : opt.state().data(), pieces);
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(c.world), mine);
  if (c.comm != nullptr && c.world > 1) c.comm->all_gather(&mine, sums.data(), sizeof mine);
  // Rank 0 commits and says whether it could: the others neither wait for a commit that
  // failed nor write the next save's files while rank 0 still tidies this one's folder.
  commit_on_rank0(
      c,
      [&] {
        commit_sharded_snapshot(o.snapshot, h, layout->slots, c.world, pieces,
                                to_string(engine.sharding()), sums);
      },
      "sharded snapshot " + o.snapshot);
}

void commit_on_rank0(const TrainContext& c, const std::function<void()>& commit,
                     const std::string& what) {
  std::int32_t committed = 1;
  std::exception_ptr error;
  if (c.rank == 0) {
    try {
      commit();
    } catch (...) {
      error = std::current_exception();
      committed = 0;
    }
  }
  if (c.comm != nullptr && c.world > 1) c.comm->broadcast(&committed, sizeof committed, 0);
  if (error) std::rethrow_exception(error);
  if (committed == 0) {
    throw IoError(what +
                  ": rank 0 could not commit it (its error names why; every rank's shard must "
                  "be in a folder rank 0 sees)");
  }
}

// A run's snapshots, stops and heals (run.hpp; the loop that calls them is trainer.cpp's).
namespace detail {

void Run::resume_or_init() {
  if (auto at = load_or_init(*engine_, o_, c_)) {
    resumed_ = true;
    start_ = *at;
    last_saved_ = start_;
    if (leader()) {
      out() << "ddp-train: resuming from snapshot " << o_.snapshot << ": epoch " << start_.epoch
            << " step " << start_.step << " (global step " << start_.global_step << ")\n"
            << std::flush;
    }
  }
}

// Replicated: rank 0 writes. Sharded: every rank writes its shard, at the same positions (the
// callers are collective then: step boundaries agree, see agree_at_boundary()).
void Run::save(const Position& at, const char* why) {
  const bool sharded = engine_->shard_layout() != nullptr;
  if ((!leader() && !sharded) || o_.snapshot.empty()) return;
  if (last_saved_ && *last_saved_ == at) return;
  phase("checkpoint", at.global_step);
  if (c_.restart_count == 0 && c_.heal == 0 &&
      o_.fault.kills(FaultKind::kill_snapshot, c_.rank, at.global_step)) {
    set_before_commit_hook([&] { injected_kill(out(), c_.rank, at.global_step, " mid-snapshot"); });
  }
  save_snapshot(*engine_, o_, c_, at);
  set_before_commit_hook(nullptr);  // unused when this rank wrote nothing
  last_saved_ = at;
  if (leader()) {
    out() << "ddp-train: " << (sharded ? "sharded " : "") << "snapshot " << o_.snapshot
          << " written (" << why << "): epoch " << at.epoch << " step " << at.step
          << " global step " << at.global_step << "\n"
          << std::flush;
  }
}

// After a peer vanished mid-step: whether this rank is being stopped too. scancel signals the
// nodes one after another, so a peer may stop at a step boundary before our own signal has
// arrived; it is given a second to arrive before the peer's exit counts as a failure.
bool Run::being_stopped(std::chrono::milliseconds wait) const {
  if (c_.stop_signal == nullptr) return false;
  const auto until = Clock::now() + wait;
  while (c_.stop_signal->load() == 0) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A peer died mid-step (in-place recovery): the step is dropped on this rank (the engine
// zeroes its gradients; no optimizer step ran), the communicators are rebuilt with the dead
// rank's replacement, and every rank takes the state of the survivor holding the newest step.
// False when the engine cannot heal (the launcher then restarts the job).
// A failure during the heal itself (another death) withdraws the declaration first: this rank's
// exit then restarts the job, as torchrun's would.
bool Run::heal_from(const Error& e) {
  const auto t0 = Clock::now();
  std::cerr << "ddp-train rank " << c_.rank << ": " << e.what() << "; step " << pos_.global_step
            << " dropped, healing in place\n"
            << std::flush;
  phase("heal", pos_.global_step);
  kill_if(FaultKind::kill_heal, pos_.global_step, " entering the heal");
  PeerState got;
  try {
    if (!engine_->heal([&] { return c_.comm = c_.reconnect(); })) return false;
    c_.rank = c_.comm->rank();  // a regroup changes them
    c_.world = c_.comm->size();
    got = copies_ ? heal_shards(*engine_, *c_.comm, *copies_, false)
                  : sync_from_peer(*engine_, *c_.comm, pos_);
  } catch (const Error& during) {
    if (c_.progress != nullptr) c_.progress->declare("recover=restart");
    const int stop = c_.stop_signal != nullptr ? c_.stop_signal->load() : 0;
    if (stop == 0) throw;
    std::cerr << "ddp-train rank " << c_.rank << ": the heal stops: " << during.what() << "\n"
              << std::flush;
    // The agent restarts the job instead (another death, no restarts left for a heal): the
    // snapshot at pos_ (the step was dropped, the state is pos_'s), then the stop's exit code.
    stop_on_signal(stop, !copies_);  // a sharded snapshot needs every rank's communicator
    return true;
  }
  // A survivor that went back to an older copy (--shard-copy-every K > 1) forgets the steps it
  // takes again.
  const std::int64_t undone = std::max<std::int64_t>(0, pos_.global_step - got.at.global_step);
  step_losses_.resize(step_losses_.size() -
                      std::min(step_losses_.size(), static_cast<std::size_t>(undone)));
  steps_this_run_ -= std::min(steps_this_run_, undone);
  pos_ = got.at;
  healed_ = true;
  std::cerr << "ddp-train rank " << c_.rank << ": healed in "
            << std::chrono::duration<double>(Clock::now() - t0).count()
            << " s: going on from global step " << pos_.global_step << " (rank " << got.from
            << "'s state)\n"
            << std::flush;
  return true;
}

// This process replaces a rank that died: the state comes from a survivor, not from disk.
void Run::join_as_replacement() {
  const PeerState got = copies_ ? heal_shards(*engine_, *c_.comm, *copies_, true)
                                : sync_from_peer(*engine_, *c_.comm, std::nullopt);
  start_ = got.at;
  resumed_ = true;
  std::cerr << "ddp-train rank " << c_.rank << ": replacement (heal " << c_.heal << "): rank "
            << got.from << "'s state at global step " << start_.global_step << ", no disk read\n"
            << std::flush;
}

// A stop signal arrived: the snapshot at pos_, then the run ends with 128 + the signal.
void Run::stop_on_signal(int signal, bool snapshot) {
  if (snapshot) save(pos_, "stop signal");
  exit_code_ = 128 + signal;
  stopping_ = true;
}

// Sharded ranks write snapshots together, so they must stop and save at the same step
// boundary: each boundary they share their stop signal and SIGUSR1 (one small all-gather),
// and every rank acts on the first rank's signal and on any rank's request.
void Run::agree_at_boundary(int& stop, bool& save_now) {
  if (c_.comm == nullptr || c_.world < 2) return;
  const int mine[2] = {stop, save_now ? 1 : 0};
  std::vector<int> all(2 * static_cast<std::size_t>(c_.world));
  c_.comm->all_gather(mine, all.data(), sizeof mine);
  for (std::size_t r = 0; r < all.size(); r += 2) {
    if (stop == 0) stop = all[r];
    save_now = save_now || all[r + 1] != 0;
  }
}

}  // namespace detail

}  // namespace ddp::train
