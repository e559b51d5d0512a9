#!/usr/bin/env bash
# Install everything mlxdist needs to build, test and benchmark on Debian 12.
# Run as root (or with sudo). Safe to run again.
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang clang-format libcjson-dev libssl-dev openmpi-bin libopenmpi-dev
      valgrind gnuplot-nox iproute2 nftables procps tcpdump openssh-server openssh-client
      libibverbs1   # jaccl loads it at run time (dlopen); the runtime only: no RDMA headers needed
      mpich libmpich-dev # the mpi plugin is also tested against MPICH (scripts/test.sh; Open MPI stays the default mpicc/mpirun)
      libpmix2 libpmix-dev # the ring under PMIx loads libpmix at run time; <pmix.h> for config_pmix_abi
      # tests/vm (soft-RoCE in a VM, docs/jaccl.md): qemu, Debian's kernel (its rdma_rxe module),
      # the initramfs' tools (busybox, kmod; iproute2 has `rdma`), the rxe provider, ibv_rc_pingpong,
      # perftest's ib_write_bw (RDMA writes across the two-VM wire, tests/vm/vm_rxe_two.sh).
      # Measured: 46 packages, ~640 MB, 7 min on a loaded 2-core machine (most of it the kernel
      # package's own initramfs, which the VM does not use).
      qemu-system-x86 linux-image-amd64 busybox-static kmod ibverbs-providers ibverbs-utils cpio perftest
      # tests/slurm (a Slurm cluster in network namespaces, docs/slurm.md): the daemons, the
      # clients (srun, sbatch), munge for their authentication (libpmix-dev, above, is needed
      # here too: Slurm's pmix plugin loads the unversioned libpmix.so that only the -dev
      # package ships, and tests/slurm/pmix_probe.c builds against its pmix.pc)
      slurmctld slurmd slurm-client munge)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all build and test dependencies are installed"
