// A whole job that breaks "every rank calls every collective" the way user programs do, ended
// by tnt::run_main as the training programs are; collective_job.sh runs it under mpirun and
// checks that the job fails fast, on every rank, with a message that names the call and the
// fix, and that TNT_COLLECTIVE_TIMEOUT=0 waits for a late rank.
//
//   test_comm_collective_job master_callback PATH   a master-only callback calls save_weights
//   test_comm_collective_job master_save PATH       save_weights under is_master_rank()
//   test_comm_collective_job master_allreduce       an allreduce under is_master_rank()
//   test_comm_collective_job late_rank              the last rank joins 2 s late
//   test_comm_collective_job out_of_memory          the master reserves 2 exabytes
//   test_comm_collective_job no_threads             the master cannot start a thread (EAGAIN)
//   test_comm_collective_job master_evaluate        fit, then evaluate() under is_master_rank()
//   test_comm_collective_job master_save_midway PATH fit, save_weights under is_master_rank(), fit
#include "small_nets.hpp"
#include "tarantella/tarantella.hpp"

#include <chrono>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

// A user's checkpoint callback written as a Keras one would be: the default Ranks (master).
class MasterSaver : public tnt::Callback {
 public:
  explicit MasterSaver(std::string path) : path_(std::move(path)) {}
  void on_epoch_end(int, const tnt::Logs&) override { model_->save_weights(path_); }

 private:
  std::string path_;
};

void master_callback(const std::string& path) {
  tnt::Model model(tnt::test::small_mlp(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 2;
  fit.verbose = 0;
  fit.callbacks = {std::make_shared<MasterSaver>(path)};
  model.fit(tnt::test::threshold_data("collective_job"), fit);
}

void master_save(const std::string& path) {
  tnt::Model model(tnt::test::small_mlp(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  if (tnt::is_master_rank()) model.save_weights(path);
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 2;
  fit.verbose = 0;
  model.fit(tnt::test::threshold_data("collective_job"), fit);
}

void master_allreduce() {
  // Only the master sums (an MPI allreduce); every rank then reduces a tensor (the ring):
  // the two calls cannot match, so both sides wait until they look at each other.
  if (tnt::is_master_rank()) tnt::communicator().allreduce_sum(std::vector<double>{1.0, 2.0});
  tnt::Tensor t = tnt::Tensor::full({4}, 1.0);
  tnt::communicator().allreduce(t);
}

// The Horovod habit of evaluating on rank 0 only: the other ranks end their program while
// the master waits in evaluate()'s first collective.
void master_evaluate() {
  tnt::Model model(tnt::test::small_mlp(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 1;
  fit.verbose = 0;
  model.fit(tnt::test::threshold_data("collective_job"), fit);
  if (tnt::is_master_rank()) {
    tnt::EvaluateOptions ev;
    ev.batch_size = 16;
    ev.verbose = 0;
    model.evaluate(tnt::test::threshold_data("collective_job"), ev);
  }
}

// The Horovod habit between two fits: the master's broadcasts meet the others' first
// collectives of the second fit, and MPI completes them, with garbage in the values.
void master_save_midway(const std::string& path) {
  tnt::Model model(tnt::test::small_mlp(), 3);
  model.compile(std::make_shared<tnt::SGD>(0.1), std::make_shared<tnt::SoftmaxCrossEntropy>());
  tnt::FitOptions fit;
  fit.batch_size = 16;
  fit.epochs = 1;
  fit.verbose = 0;
  model.fit(tnt::test::threshold_data("collective_job"), fit);
  if (tnt::is_master_rank()) model.save_weights(path);
  model.fit(tnt::test::threshold_data("collective_job"), fit);
}

// Not a collective matter, but run_main's end as well: an allocation no host can hold.
void out_of_memory() {
  std::vector<double> rows;  // as a Dataset::batch of 2^58 rows reserves them
  if (tnt::is_master_rank()) rows.reserve(size_t{1} << 58);  // 2 EiB
  tnt::communicator().barrier();
}

// As std::thread throws where the limit on processes and threads (ulimit -u, a cgroup's
// pids.max) is reached: what() is only "Resource temporarily unavailable".
void no_threads() {
  if (tnt::is_master_rank()) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
  tnt::communicator().barrier();
}

void late_rank() {
  tnt::Communicator& comm = tnt::communicator();
  if (comm.rank() == comm.size() - 1) std::this_thread::sleep_for(std::chrono::seconds(2));
  const double sum = comm.allreduce_sum(1.0);
  TNT_CHECK(sum == comm.size(), "late_rank: the sum of ones is {}, not {}", sum, comm.size());
  std::printf("late_rank: rank %d of %d, timeout %g s, sum %g\n", comm.rank(), comm.size(), comm.timeout(), sum);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  const std::string path = argc > 2 ? argv[2] : "";
  return tnt::run_main(argc, argv, [&] {
    if (which == "master_callback" && !path.empty()) {
      master_callback(path);
    } else if (which == "master_save" && !path.empty()) {
      master_save(path);
    } else if (which == "master_allreduce") {
      master_allreduce();
    } else if (which == "late_rank") {
      late_rank();
    } else if (which == "out_of_memory") {
      out_of_memory();
    } else if (which == "no_threads") {
      no_threads();
    } else if (which == "master_evaluate") {
      master_evaluate();
    } else if (which == "master_save_midway" && !path.empty()) {
      master_save_midway(path);
    } else {
      TNT_INPUT_ERROR("usage: {} master_callback PATH | master_save PATH | master_save_midway PATH | master_allreduce | master_evaluate | late_rank", argv[0]);
    }
  });
}
