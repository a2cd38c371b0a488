// GPU metrics labelled by job: NVIDIA's DCGM exporter (--hpc-job-mapping-dir, or
// DCGM_HPC_JOB_MAPPING_DIR) reads a folder with one file per GPU, named by its NVML index, that
// holds the ids of the jobs using that GPU, one per line, and labels that GPU's metrics with
// them. The agent adds its job's id to the files of its workers' GPUs while the job runs and
// takes it out at exit, leaving other jobs' lines (several jobs may share a GPU). Each change
// holds the file's flock and replaces the file whole (rename), so the exporter never reads
// half a file. The line edits are pure and tested without files.
#pragma once

#include <string>
#include <vector>

namespace ddp::launch {

// `text` (one job id per line) with `job` added once / with every line equal to `job` removed.
std::string with_job(const std::string& text, const std::string& job);
std::string without_job(const std::string& text, const std::string& job);

class GpuJobMapping {
 public:
  // Adds `job` to DIR/<index> for each index >= 0 of `gpus` (the NVML indices of the node's
  // workers' GPUs). Throws ddp::ConfigError naming --gpu-job-mapping-dir when DIR is no folder
  // or cannot be written; a job id with a newline or over 256 bytes likewise.
  GpuJobMapping(std::string dir, std::string job, const std::vector<int>& gpus);
  ~GpuJobMapping();  // takes the lines out again; a file left empty is removed
  GpuJobMapping(const GpuJobMapping&) = delete;
  GpuJobMapping& operator=(const GpuJobMapping&) = delete;

  const std::vector<std::string>& files() const { return files_; }

 private:
  std::string dir_, job_;
  std::vector<std::string> files_;  // the files this job's id went into
};

}  // namespace ddp::launch
