// ember — the distributed umbrella: process groups and their collectives (shm and tcp; mpi and nccl by their own
// headers), started from torchrun / ember-run / mpirun / srun environments. Data-parallel training and the sharded
// optimizer sit in the layers above, each a header of its own:
//   #include <ember/nn/ddp.hpp>     nn::DistributedDataParallel
//   #include <ember/optim/zero.hpp> optim::ZeroRedundancyOptimizer (ZeRO-1)
//   #include <ember/dist/mpi.hpp>   the MPI backend (CMake target ember::mpi)
//   #include <ember/dist/nccl.hpp>  NCCL for CUDA tensors (CMake target ember::nccl)
#pragma once

#include "ember/dist/init.hpp"
#include "ember/dist/process_group.hpp"
