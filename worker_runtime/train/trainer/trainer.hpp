// The training loop of ddp-train: data split as DistributedSampler does, forward, backward with
// bucketed all-reduce, the optimizer step, snapshots (periodic, on signals, on a peer's failure),
// resume, progress (rank 0's lines; every rank's step and phase to the agent), evaluation and
// the metrics file, and DDP_TRAIN_FAULT's injected faults. Options come parsed and checked
// (options.hpp); the communicator comes connected (or null for one process).
#pragma once

#include <functional>
#include <atomic>
#include <iosfwd>

#include "options.hpp"

namespace ddp::worker {
class Communicator;
class ProgressWriter;
}  // namespace ddp::worker

namespace ddp::train {

struct MeshComms;

struct TrainContext {
  int rank = 0;
  int world = 1;
  int restart_count = 0;
  worker::Communicator* comm = nullptr;         // host collectives (broadcast, CPU gradients)
  worker::Communicator* device_comm = nullptr;  // NCCL, for the CUDA engine's gradients
  int cuda_device = 0;
  const std::atomic<int>* stop_signal = nullptr;  // SIGTERM/SIGINT number, 0 while none
  std::atomic<bool>* save_request = nullptr;      // SIGUSR1
  std::ostream* out = nullptr;                    // rank 0's progress
  bool tty = false;                               // progress bar instead of lines
  // DDPRUN_PROGRESS_FD, or null: each optimizer step writes "step=<n> phase=compute" before its
  // forward and backward passes and "step=<n> phase=allreduce" before waiting for the gradient
  // all-reduce; rank 0 also "phase=checkpoint" before a snapshot and "phase=eval" before the
  // evaluation. n is the global step being taken, counted from 0 (DDP_TRAIN_FAULT's numbering).
  worker::ProgressWriter* progress = nullptr;
  MeshComms* mesh = nullptr;  // --model llama: this rank's place and its dp and tp groups
  // In-place recovery (--recovery in-place under ddprun; docs/ddp_train.md): gives up this
  // rank's communicators and returns the host communicator of the next generation, once every
  // rank (the dead one's replacement too) has joined it. Null: a peer's death ends this rank
  // and the launcher restarts the job (torchrun's rule).
  std::function<worker::Communicator*()> reconnect;
  // The CUDA engine, after reconnect(): the device communicator (NCCL) of the same generation.
  // Null: the CUDA engine cannot heal in place.
  std::function<worker::Communicator*()> reconnect_device;
  int heal = 0;  // DDPRUN_HEAL: this process replaces a rank that died (the heal's ordinal)
  // Regrouping (an elastic job that shrank or grew): true when the agent's regroup line came;
  // the step then ends as a peer's death would, and reconnect() returns the new group's
  // communicator (rank and world are then its rank() and size()). Null: no regrouping.
  std::function<bool()> regroup_pending;
  bool regroups = false;  // declared to the agent: "recover=elastic" instead of "in_place"
  // A rank that joins a running job (DDPRUN_JOIN_ROUND): comm is null until the data is loaded;
  // this connects it then (the running ranks wait for it only from there).
  std::function<worker::Communicator*()> connect_late;
};

// Returns the exit code: 0 when done, 128 + signal when stopped by one. Throws on errors.
int train(const TrainOptions& options, const TrainContext& ctx);
// --model llama's loop (lm_trainer.cpp); train() hands it over.
int train_lm(const TrainOptions& options, const TrainContext& ctx);

}  // namespace ddp::train
