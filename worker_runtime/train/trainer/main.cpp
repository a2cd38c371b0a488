// ddp-train: the built-in data-parallel trainer, one process per rank under ddprun or torchrun
// (docs/ddp_train.md). Parses the command line, reads the worker environment, connects the
// communicator through the job's store, reports each step to the agent (DDPRUN_PROGRESS_FD), and
// reports errors in torchrun's error-file format.
#include <cblas.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/proto/version.hpp"
#include "ddp/kernels/device.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/knobs.hpp"
#include "ddp/proto/number.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/worker/comm.hpp"
#include "ddp/worker/device.hpp"
#include "ddp/worker/env.hpp"
#include "ddp/worker/error_file.hpp"
#include "ddp/worker/membership.hpp"
#include "ddp/worker/progress.hpp"
#include "conv_gemm.hpp"
#include "mesh.hpp"
#include "trainer.hpp"

extern char** environ;

namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_save_request{false};

void on_stop(int sig) { g_stop_signal.store(sig); }
void on_save(int) { g_save_request.store(true); }

void install_signals() {
  struct sigaction sa {};
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = on_stop;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sa.sa_handler = on_save;
  sigaction(SIGUSR1, &sa, nullptr);
  // As CPython does at start: a write to a pipe or socket whose reader is gone fails with EPIPE
  // instead of killing the rank. The progress pipe's writer then stops (the agent is gone), and
  // Gloo's writev to a vanished peer throws, which the trainer handles as a peer's failure.
  sa.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &sa, nullptr);
}

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

int default_threads(const std::map<std::string, std::string>& env) {
  try {
    return static_cast<int>(ddp::knobs::integer("OMP_NUM_THREADS", 1, 1 << 16, &env));
  } catch (const ddp::ConfigError&) {
    return 1;  // unset or not a count: one thread per rank, as torchrun's default
  }
}

// Subnormal floats as zero on this thread and the threads it starts: FTZ (results) and DAZ
// (inputs) in MXCSR on x86-64, FZ in FPCR on AArch64; elsewhere nothing changes.
void flush_denormals() {
#if defined(__x86_64__)
  _mm_setcsr(_mm_getcsr() | 0x8040u);  // bit 15 FTZ, bit 6 DAZ
#elif defined(__aarch64__)
  std::uint64_t fpcr = 0;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  asm volatile("msr fpcr, %0" : : "r"(fpcr | (std::uint64_t{1} << 24)));
#endif
}

// OpenBLAS built with DYNAMIC_ARCH picks its kernels from the CPU model at load time; a release
// that does not know the model (0.3.21, Debian 12's, on Sapphire Rapids) falls back to its SSE3
// "Prescott" kernels, 3 to 6 times slower than the AVX2/AVX-512 ones the CPU can run. OpenBLAS
// reads OPENBLAS_CORETYPE only at load, so when it is unset and that fallback happened on a CPU
// with AVX-512 (or AVX2), ddp-train sets it and re-executes itself: same pid, arguments and
// descriptors. A user's own OPENBLAS_CORETYPE is left alone; if the exec fails, it runs as is.
void prefer_native_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* core = openblas_get_corename();
  if (core == nullptr || std::string(core) != "Prescott") return;
  const char* better = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    better = "Haswell";
  }
  if (better == nullptr || ::setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
  // The binary's own path, not /proc/self/exe: the process name (comm) is the executed file's
  // name, and ddprun, ps and the tests know the worker as "ddp-train".
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    ::execv(self, argv);
  }
  ::unsetenv("OPENBLAS_CORETYPE");  // the exec failed: go on with the kernels we have
}

// The error file's "type": the error's kind, as a Python traceback would name it.
const char* error_type(const std::exception& e) {
  if (dynamic_cast<const ddp::ConfigError*>(&e) != nullptr) return "ConfigError";
  if (dynamic_cast<const ddp::IoError*>(&e) != nullptr) return "IoError";
  if (dynamic_cast<const ddp::CudaError*>(&e) != nullptr) return "CudaError";
  if (dynamic_cast<const ddp::NcclError*>(&e) != nullptr) return "NcclError";
  return "RuntimeError";
}

}  // namespace

// Why this run cannot recover in place ("" when it can): the CPU engines (sharded ones with
// their shard copies) and the replicated CUDA engine, under a ddprun agent, with a store that
// outlives any rank (the agent's).
std::string in_place_blocker(const ddp::train::TrainOptions& o, const ddp::worker::WorkerEnv& w,
                             bool under_ddprun) {
  using namespace ddp::train;
  if (!under_ddprun) return "no ddprun agent to replace a rank alone (DDPRUN_PROGRESS_FD unset)";
  if (!w.use_agent_store) return "the job's store is rank 0's (TORCHELASTIC_USE_AGENT_STORE)";
  if (o.device != Device::cpu && o.sharding != Sharding::none) {
    return "--device cuda with --sharding recovers by a restart for now";
  }
  if (o.device != Device::cpu && o.backend != Backend::nccl) {
    return "--device cuda heals its NCCL communicator only (--backend nccl)";
  }
  if (o.sharding != Sharding::none && o.shard_copy_every == 0) {
    return "--sharding with --shard-copy-every 0 keeps no copy of a rank's shard";
  }
  if (o.model == ModelKind::llama) return "--model llama recovers by a restart for now";
  return "";
}

// `ddp-train --gpu-libraries`: where the CUDA build finds cuBLAS and NCCL, or why not (exit 1).
// Handled before the flag parser, as --version is, since TOTAL_EPOCHS is required there.
std::optional<int> gpu_libraries_flag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--gpu-libraries") continue;
    bool all_found = true;
    std::cout << ddp::version_line("ddp-train") << "\n"
              << ddp::kernels::gpu_libraries_report(all_found) << std::flush;
    return all_found ? 0 : 1;
  }
  return std::nullopt;
}

int main(int argc, char** argv) {
  if (auto rc = gpu_libraries_flag(argc, argv)) return *rc;
  prefer_native_blas_kernels(argv);
  using namespace ddp;
  const auto env = environment();
  train::TrainOptions o;
  train::ChoiceWords words;  // --model, --dataset, ...: enums once apply_choices() has run
  int threads = default_threads(env);
  bool no_eval = false;
  bool shm_allreduce = true;
  std::optional<std::string> progress_fd;
  std::optional<std::string> control_fd;
  int join_round = -1;  // DDPRUN_JOIN_ROUND: this worker joins a running elastic job
  CLI::App app{"ddp-train: data-parallel training on Fashion-MNIST or synthetic data"};
  app.set_version_flag("--version", ddp::version_line("ddp-train"));
  std::string recovery = "auto";
  app.add_option("--recovery", recovery,
                 "auto | in-place | restart: in-place: under ddprun, a rank that dies is replaced "
                 "while the others keep their state and heal it from a peer (CPU engines, "
                 "the replicated CUDA engine; docs/ddp_train.md); restart: every rank "
                 "restarts, as under torchrun; auto: in-place for the replicated CPU engine, "
                 "else restart")
      ->check(CLI::IsMember({"auto", "restart", "in-place"}))
      ->capture_default_str();
  app.add_option("--shard-copy-every", o.shard_copy_every,
                 "with --sharding, healing in place: each rank's shard is copied to its "
                 "successor every K steps (0: no copies, a death restarts the job)")
      ->capture_default_str();
  bool gpu_libraries = false;  // for --help only: gpu_libraries_flag() answers it
  app.add_flag("--gpu-libraries", gpu_libraries,
               "print where cuBLAS and NCCL load from (CUDA builds: found at run time, "
               "docs/install.md) and exit; 1 when one is missing");
  app.add_option("TOTAL_EPOCHS", o.total_epochs, "epochs to train")->required();
  app.add_option("SAVE_EVERY", o.save_every, "write the snapshot every N epochs (0: never)")
      ->required();
  app.add_option("--batch-size,--batch_size", o.batch_size, "samples per rank per step")
      ->capture_default_str();
  app.add_option("--model", words.model, "mlp | autoencoder | linear | convnet | llama");
  app.add_option("--dataset", words.dataset, "fashion-mnist | synthetic")->capture_default_str();
  app.add_option("--data", o.data_dir, "folder of the IDX files")->capture_default_str();
  app.add_option("--train-subset", o.train_subset, "use the first N training samples");
  app.add_option("--synthetic-size", o.synthetic_size, "samples of the synthetic dataset")
      ->capture_default_str();
  auto* lr = app.add_option("--lr", o.optimizer.lr,
                            "learning rate (default: the model's recipe, or torch.optim's default "
                            "for another --optimizer)");
  auto* optimizer = app.add_option(
      "--optimizer", words.optimizer,
      "sgd | adam | adadelta | adamw (default: the model's recipe: " + train::recipes_text() + ")");
  auto* lr_gamma = app.add_option("--lr-gamma", o.lr_gamma,
                                  "StepLR: epoch e runs with lr x gamma^e, gamma in (0, 1] "
                                  "(default: the model's recipe)");
  app.add_option("--momentum", o.optimizer.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--seed", o.seed, "initialisation and shuffle seed")->capture_default_str();
  app.add_option("--hidden", o.hidden, "mlp: units per hidden layer (default 256, then 128)");
  app.add_option("--layers", o.layers, "mlp: hidden layers (default 2)");
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step")
      ->capture_default_str();
  app.add_option("--snapshot", o.snapshot, "snapshot path (\"\": none)")->capture_default_str();
  app.add_option("--metrics-json", o.metrics_json, "rank 0 writes the run's figures here");
  app.add_option("--threads", threads, "BLAS threads per rank (default OMP_NUM_THREADS or 1)");
  app.add_option("--backend", words.backend, "auto | gloo | nccl (auto: nccl on cuda, else gloo)")
      ->capture_default_str();
  app.add_option("--device", words.device, "auto | cpu | cuda (auto: cuda when a GPU is visible)")
      ->capture_default_str();
  app.add_option("--precision", words.precision, "fp32 | bf16 (bf16: cuda only)")
      ->capture_default_str();
  app.add_option("--bucket-cap-mb", o.bucket_cap_mb, "gradient bucket size")->capture_default_str();
  app.add_option("--max-steps", o.max_steps, "stop after N optimizer steps (0: no limit)");
  app.add_option("--log-every", o.log_every, "progress line every N steps (0: ~10 per epoch)");
  app.add_flag("--no-eval", no_eval, "skip the test-set evaluation");
  app.add_option("--sharding", words.sharding,
                 "none | optimizer | gradients | full (ZeRO-1/2/3; FSDP NO_SHARD, SHARD_GRAD_OP, "
                 "FULL_SHARD)")
      ->capture_default_str();
  bool no_prefetch = false;
  std::string denormals = "flush";
  app.add_option("--denormals", denormals,
                 "cpu: flush | keep (flush: subnormal floats are computed as zero, FTZ/DAZ)")
      ->capture_default_str();
  app.add_flag("--no-prefetch", no_prefetch,
               "full sharding: gather each layer only when it runs (no overlap)");
  // --model llama (issue 20; docs/ddp_train.md "The language model").
  app.add_option("--dim", o.lm.dim, "llama: model width")->capture_default_str();
  app.add_option("--n-layers", o.lm.n_layers, "llama: transformer blocks")->capture_default_str();
  app.add_option("--n-heads", o.lm.n_heads, "llama: attention heads")->capture_default_str();
  app.add_option("--ffn-hidden", o.lm.ffn_hidden,
                 "llama: feed-forward units (0: LLaMA's rule, 2/3 of 4 x dim rounded up to 256)")
      ->capture_default_str();
  app.add_option("--seq-len", o.lm.seq_len, "llama: tokens (bytes) per sequence")
      ->capture_default_str();
  app.add_flag("--tie-embeddings", o.lm.tied, "llama: the output layer is the embedding");
  app.add_option("--mesh", o.mesh, "llama: dp=D,tp=T (tensor parallel groups on one node)");
  app.add_option("--text", o.text, "llama: a text file, or a folder of them (fortune's)")
      ->capture_default_str();
  app.add_option("--val-fraction", o.val_fraction, "llama: the text's last part, for validation")
      ->capture_default_str();
  app.add_option("--eval-seqs", o.eval_seqs, "llama: validation sequences per evaluation")
      ->capture_default_str();
  app.add_option("--epoch-steps", o.epoch_steps,
                 "llama: optimizer steps per epoch (0: one pass over the text's tokens)")
      ->capture_default_str();
  app.add_option("--weight-decay", o.optimizer.weight_decay, "adamw's weight decay")
      ->capture_default_str();
  std::vector<train::Fault> faults;  // DDP_TRAIN_FAULT: this rank's is taken once it is known
  try {
    app.parse(argc, argv);
    o.eval = !no_eval;
    o.prefetch = !no_prefetch;
    if (auto fault = knobs::text("DDP_TRAIN_FAULT", &env)) faults = train::parse_faults(*fault);
    shm_allreduce = knobs::flag01("DDP_SHM_ALLREDUCE", &env);  // checked before any peer
    progress_fd = knobs::text("DDPRUN_PROGRESS_FD", &env);
    control_fd = knobs::text("DDPRUN_CONTROL_FD", &env);
    if (auto r = knobs::text("DDPRUN_JOIN_ROUND", &env)) {
      join_round = static_cast<int>(parse_int(*r, "DDPRUN_JOIN_ROUND", 0, 1 << 24));
    }
    if (threads < 1) throw ConfigError("--threads must be >= 1");
    if (denormals != "flush" && denormals != "keep") {
      throw ConfigError("--denormals must be flush or keep, not '" + denormals + "'");
    }
    if (optimizer->count() > 0 && words.optimizer.empty()) {  // "" is no name, not the recipe
      throw ConfigError("--optimizer '': expected sgd, adam, adadelta or adamw");
    }
    words.lr_given = lr->count() > 0;
    words.lr_gamma_given = lr_gamma->count() > 0;
    train::apply_choices(
        words, [] { return kernels::cuda_built() && kernels::cuda_device_count() > 0; }, o);
    train::validate(o);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const ConfigError& e) {
    std::cerr << "ddp-train: error: " << e.what() << "\n";
    return 2;
  }
  // The convnet splits each convolution's batch over the threads itself, with BLAS on one thread
  // (conv_gemm.hpp: OpenBLAS's idle threads would spin against them); other models give the
  // threads to BLAS.
  if (o.model == train::ModelKind::convnet && o.device == train::Device::cpu) {
    train::set_conv_threads(threads);
    openblas_set_num_threads(1);
  } else {
    openblas_set_num_threads(threads);
  }
  // Before any thread starts (threads inherit the mode): subnormals cost ~100 cycles an op on x86
  // and the LM's Adam moments and attention tails run into them (docs/decisions.md).
  if (denormals == "flush") flush_denormals();
  install_signals();
  // Progress is a side channel: a bad DDPRUN_PROGRESS_FD is told once and training goes on.
  std::string why;
  worker::ProgressWriter progress = worker::ProgressWriter::from_env(progress_fd, &why);
  if (!why.empty()) std::cerr << "ddp-train: warning: " << why << "; no progress to the agent\n";
  if (control_fd && progress.on()) {  // the agent's lines to this worker (regroup.hpp)
    why.clear();
    const auto fd = worker::parse_progress_fd(*control_fd, &why, "DDPRUN_CONTROL_FD");
    if (!fd || !progress.listen(*fd, &why)) {
      std::cerr << "ddp-train: warning: " << why << "; this rank cannot regroup\n";
    }
  }
  // auto: the replicated engine heals in place; a sharded one only when asked (--recovery
  // in-place), since its shard copies cost two more shards of memory per rank and who shards
  // does so for memory (docs/decisions.md).
  // The CUDA engine's heal has not run on GPUs yet (docs/ddp_train.md): asked for only.
  o.in_place_recovery =
      recovery == "in-place" ||
      (recovery == "auto" && o.sharding == train::Sharding::none && o.device == train::Device::cpu);
  const int heal = static_cast<int>(knobs::integer("DDPRUN_HEAL", 0, 1 << 20, &env));

  worker::WorkerEnv wenv;
  std::string rank_tag = "ddp-train";
  std::unique_ptr<worker::Membership> member;  // a job of more than one rank
  try {
    train::TrainContext ctx;
    ctx.stop_signal = &g_stop_signal;
    ctx.save_request = &g_save_request;
    ctx.out = &std::cout;
    ctx.tty = ::isatty(STDOUT_FILENO) != 0;
    ctx.progress = progress.on() ? &progress : nullptr;
    std::unique_ptr<train::MeshComms> mesh;        // --model llama: the dp and tp groups
    const bool launched = env.count("RANK") != 0;  // else: one process, world size 1
    if (launched) {
      wenv = worker::read_worker_env(env);
      rank_tag = "ddp-train rank " + std::to_string(wenv.rank);
      ctx.rank = wenv.rank;
      ctx.world = wenv.world_size;
      ctx.restart_count = wenv.restart_count;
    }
    o.fault = train::fault_for(faults, ctx.rank);
    if (o.device == train::Device::cuda) {
      const auto cvd = env.find("CUDA_VISIBLE_DEVICES");
      ctx.cuda_device = worker::pick_cuda_device(wenv.local_rank, kernels::cuda_device_count(),
                                                 cvd == env.end() ? std::string() : cvd->second);
    }
    if (launched && wenv.world_size > 1) {
      // In-place recovery and regrouping (docs/ddp_train.md): the communicators' generations
      // and the agent's regroup lines are the membership's (ddp/worker/membership.hpp).
      const std::string no_heal = in_place_blocker(o, wenv, progress.on());
      const bool in_place = o.in_place_recovery && no_heal.empty();
      if (recovery == "in-place" && !in_place && wenv.rank == 0) {  // auto: said in the docs
        std::cerr << "ddp-train: --recovery in-place is off: " << no_heal
                  << "; a failure restarts the job\n";
      }
      worker::MembershipConfig mc;
      mc.env = wenv;
      if (auto iface = knobs::text("GLOO_SOCKET_IFNAME", &env)) mc.comm.iface = *iface;
      mc.in_place = in_place;
      // Regrouping (an elastic job that shrank or grew): the replicated engine, and only with
      // the agent's control pipe to hear the regroup line on (else "recover=in_place").
      const bool regroups = in_place && o.sharding == train::Sharding::none &&
                            o.device == train::Device::cpu && progress.listening();
      mc.regroups = regroups;
      mc.join_round = join_round;
      mc.shm_allreduce = shm_allreduce;
      mc.progress = &progress;
      mc.stop_signal = &g_stop_signal;
      member = std::make_unique<worker::Membership>(std::move(mc));
      worker::Membership& m = *member;
      const auto connect = [&] { return ctx.comm = m.connect(); };
      if (in_place) {
        ctx.heal = join_round >= 0 ? std::max(heal, 1) : heal;
        if (ctx.heal > 0) m.skip_joined_generations();
        ctx.reconnect = [&] { return ctx.comm = m.reconnect(); };  // declared when training starts
        if (regroups) {
          ctx.regroups = true;
          // A new group with joining ranks: train on until they are ready (they count
          // themselves in the new group's store once their data is loaded).
          ctx.regroup_pending = [&] { return m.regroup_pending(); };
        }
      }
      if (join_round >= 0 && ctx.regroups) {
        // Joining a running job: connect once the data is loaded, so the running ranks, who
        // train on until every joiner counted itself, stall only for the connection.
        ctx.connect_late = connect;
      } else {
        connect();
      }
      if (o.backend == train::Backend::nccl) {
        ctx.device_comm = m.connect_device(ctx.cuda_device);
        if (in_place) {
          ctx.reconnect_device = [&] {
            return ctx.device_comm = m.connect_device(ctx.cuda_device);
          };
        }
      }
      if (o.model == train::ModelKind::llama) {
        worker::CommOptions co = m.options();
        co.key_prefix = m.base() + "/mesh";
        mesh = std::make_unique<train::MeshComms>(
            train::make_mesh_comms(ctx.comm, co, train::parse_mesh(o.mesh, wenv.world_size),
                                   train::MeshBackend::gloo, shm_allreduce, ctx.cuda_device));
      }
    }
    if (o.model == train::ModelKind::llama && mesh == nullptr) {
      mesh = std::make_unique<train::MeshComms>(train::make_mesh_comms(
          nullptr, {}, train::parse_mesh(o.mesh, 1), train::MeshBackend::gloo, false, 0));
    }
    ctx.mesh = mesh.get();
    const int code = train::train(o, ctx);
    std::cout << std::flush;
    return code;
  } catch (const std::exception& e) {
    const char* type = error_type(e);
    if (member) rank_tag = member->tag();  // a regroup moves the rank
    std::cout << std::flush;
    std::cerr << rank_tag << ": error: " << e.what() << "\n" << std::flush;
    const auto ef = env.find("TORCHELASTIC_ERROR_FILE");
    // The trace ends like a Python one, "<type>: <message>", so the agent's summary shows it.
    worker::write_error_file(ef == env.end() ? std::string() : ef->second, type, e.what(),
                             rank_tag + "\n" + type + ": " + e.what());
    return worker::kWorkerErrorExitCode;
  }
}
