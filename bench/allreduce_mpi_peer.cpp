// The Open MPI peer of bench_allreduce: MPI_Allreduce (in place, float32 sum) under mpirun, timed by the same loop as
// ember's (allreduce_sweep.hpp). On one host Open MPI moves the data through its shared-memory transport (vader).
//   mpirun -n 2 allreduce_mpi_peer [--sizes=1K,64M]
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <string>

#include "allreduce_sweep.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string sizes;
  if (argc > 1 && std::string(argv[1]).rfind("--sizes=", 0) == 0) sizes = argv[1] + 8;
  bench::sweep(rank, bench::sweep_sizes(sizes),
               [](float* p, std::size_t n) { MPI_Allreduce(MPI_IN_PLACE, p, int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
               [] { MPI_Barrier(MPI_COMM_WORLD); });
  MPI_Finalize();
  return 0;
}
