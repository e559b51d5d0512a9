# Shared by rxe_vm.sh (one VM) and rxe_vm2.sh (two VMs on one wire): the host
# checks, the initramfs, the guest's /init and the qemu command line of the
# project's soft-RoCE VMs (issue 23). Sourced, not run; bash, set -euo pipefail.
#   vm_check_host            exit 77 (skip) without root, qemu, a kernel with
#                            rdma_rxe, the tools or the rxe provider; sets vm_kver
#   vm_build_initrd WORK ELF...   WORK/initrd.gz: busybox, kmod, rdma, the
#                            modules, the rxe provider, ibverbs-utils and
#                            perftest when installed, the shared libraries of
#                            every ELF named (at the paths ldd finds them)
#   vm_qemu_cmd APPEND QEMU_ARG...  sets vm_cmd to the command line of one VM
#                            (1 vCPU, 1 GiB, eth0 = user net without a boot
#                            ROM, /share = 9p of vm_share, the kernel and
#                            vm_work/initrd.gz) under `timeout`:
#                            MLXDIST_VM_TIMEOUT bounds it (default 400 s); run
#                            "${vm_cmd[@]}" (in the background, $! is
#                            timeout's pid: killing it stops qemu)
# The guest's /init reads its role from the kernel command line:
#   mlxvm.id=N          results in vmN.out / vmN.rc / vmN.boot and the script
#                       runN.sh (run.sh when there is no runN.sh); without it
#                       vm.out / vm.rc / vm.boot and run.sh
#   mlxvm.wire=IP/LEN   eth1 (the wire) gets IP/LEN and MTU 9000, and rxe0 is
#                       made on eth1; without it rxe0 is on eth0 (10.0.2.15/24)
#   mlxvm.peer=IP       exported to the script as PEER_IP
# The script runs in /share with VM_ID, VM_IP (rxe0's netdev address), PEER_IP.
vm_name=${vm_name:-rxe_vm}
vm_skip() {
  echo "$vm_name: SKIPPED: $*"
  exit 77
}
vm_now() { date +%s.%N; }
vm_since() { awk "BEGIN{printf \"%.1f\", $(vm_now) - $1}"; }

vm_check_host() {
  [ "$(id -u)" = 0 ] || vm_skip "needs root (the initramfs copies system files; run as root)"
  command -v qemu-system-x86_64 >/dev/null || vm_skip "no qemu-system-x86_64 (apt-get install qemu-system-x86)"
  vm_kver=
  local k v t
  for k in /boot/vmlinuz-*; do
    [ -f "$k" ] || continue
    v=${k#/boot/vmlinuz-}
    [ -f "/lib/modules/$v/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko" ] ||
      [ -f "/lib/modules/$v/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz" ] || continue
    vm_kver=$v
  done
  [ -n "$vm_kver" ] || vm_skip "no kernel with rdma_rxe in /boot and /lib/modules (apt-get install linux-image-amd64)"
  for t in busybox kmod rdma cpio ldd; do
    command -v $t >/dev/null || vm_skip "no $t (scripts/setup-debian.sh installs it)"
  done
  [ -n "$(busybox --list 2>/dev/null | grep -x poweroff)" ] || vm_skip "busybox lacks applets (apt-get install busybox-static)"
  [ -f /etc/libibverbs.d/rxe.driver ] && ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-*.so >/dev/null 2>&1 ||
    vm_skip "no soft-RoCE provider (apt-get install ibverbs-providers)"
  ldconfig -p | grep 'libibverbs\.so\.1 ' >/dev/null || vm_skip "no libibverbs.so.1 (apt-get install libibverbs1)"
}

# The modules rdma_rxe (and crc32_generic: rxe asks the crypto API for "crc32", an ENOENT
# "failed to add eth0" without it), 9p over virtio and virtio_net need, with their dependencies.
vm_mods="virtio_pci virtio_net 9pnet_virtio 9p crc32_generic rdma_rxe ib_uverbs"

vm_build_initrd() {
  local work=$1
  shift
  local root=$work/root t0
  t0=$(vm_now)
  mkdir -p "$root"/{bin,sbin,proc,sys,dev,share,tmp,etc,run}
  cp -L "$(command -v busybox)" "$root/bin/busybox"
  cp -L "$(command -v kmod)" "$root/sbin/kmod"
  ln -s kmod "$root/sbin/modprobe"
  ln -s kmod "$root/sbin/insmod"
  cp -L "$(command -v rdma)" "$root/sbin/rdma"
  local elfs=("$root/sbin/kmod" "$root/sbin/rdma") p lib u f e m ko
  mkdir -p "$root/etc/libibverbs.d" "$root/usr/lib/x86_64-linux-gnu/libibverbs"
  cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
  for p in /usr/lib/x86_64-linux-gnu/libibverbs/librxe-*.so; do
    cp -L "$p" "$root/usr/lib/x86_64-linux-gnu/libibverbs/"
    elfs+=("$p")
  done
  lib=$(ldconfig -p | awk '/libibverbs.so.1 / && !f {print $NF; f = 1}')
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
  elfs+=("$lib")
  # OpenSSL: libmlxdist.so loads it at run time (dlopen, src/security/ossl.h) for secrets, TLS
  # and the tokens jaccl derives by digest, so ldd of the binaries does not name it
  lib=$(ldconfig -p | awk '/libssl\.so\.3 / && !f {print $NF; f = 1}')
  if [ -n "$lib" ]; then
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
    elfs+=("$lib")
  fi
  # cJSON: libmlxdist.so loads it at run time too (src/util/cjson_rt.h) for JSON documents the
  # plain hostfile reader does not take (jaccl's device matrix, hostfiles with escapes)
  lib=$(ldconfig -p | awk '/libcjson\.so\.1 / && !f {print $NF; f = 1}')
  if [ -n "$lib" ]; then
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
    elfs+=("$lib")
  fi
  # ibverbs-utils and perftest (ib_write_bw...), when installed
  for u in ibv_rc_pingpong ibv_devinfo ib_write_bw ib_send_lat; do
    command -v $u >/dev/null || continue
    cp -L "$(command -v $u)" "$root/bin/$u"
    elfs+=("$root/bin/$u")
  done
  for f in "$@"; do
    [ -f "$f" ] && [ "$(head -c4 "$f" 2>/dev/null | tail -c3)" = ELF ] && elfs+=("$f")
  done
  # Shared libraries at the paths ldd names (ld.so, libc, libibverbs, libmlxdist.so...)
  for e in "${elfs[@]}"; do
    ldd "$e" 2>/dev/null | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}' | while read -r lib; do
      [ -e "$root$lib" ] && continue
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  done
  mkdir -p "$root/lib/modules/$vm_kver"
  cp /lib/modules/"$vm_kver"/modules.{dep,dep.bin,alias,alias.bin,softdep,symbols,symbols.bin,builtin,builtin.bin,builtin.modinfo,order} \
    "$root/lib/modules/$vm_kver/" 2>/dev/null || true
  for m in $vm_mods; do
    modprobe -S "$vm_kver" --show-depends "$m" | awk '$1=="insmod"{print $2}'
  done | sort -u | while read -r ko; do
    mkdir -p "$root$(dirname "$ko")"
    cp "$ko" "$root$ko"
  done
  vm_write_init "$root/init"
  (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 >"$work/initrd.gz")
  echo "$vm_name: kernel $vm_kver, initramfs $(du -k "$work/initrd.gz" | cut -f1) KiB built in $(vm_since "$t0") s"
}

vm_write_init() {
  {
    echo '#!/bin/busybox sh'
    echo "mods=\"$vm_mods\""
    cat <<'INIT'
/bin/busybox --install -s /bin
export PATH=/bin:/sbin LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev  # /dev/infiniband/uverbs0 appears here: no udev needed
# /dev/shm, as on any host: shared memory between the ranks of this host (shm_open)
mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 tmpfs /dev/shm
# /tmp stays the initramfs's own (already in memory and writable): a tmpfs mounted there hid the
# build tree's libraries when the build is under /tmp (CI's clone), copied in at their host paths
t() { cut -d' ' -f1 /proc/uptime; }
id= wire= peer=
for a in $(cat /proc/cmdline); do
  case $a in
    mlxvm.id=*) id=${a#mlxvm.id=} ;;
    mlxvm.wire=*) wire=${a#mlxvm.wire=} ;;
    mlxvm.peer=*) peer=${a#mlxvm.peer=} ;;
  esac
done
hostname "vm$id"
echo "vm$id: init at $(t) s"
for m in $mods; do
  modprobe $m || echo "vm$id: modprobe $m failed"
done
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /share; then
  echo "vm$id: cannot mount the share"; poweroff -f
fi
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
if [ -n "$wire" ]; then
  # the wire to the other VM: jumbo frames (rxe's active_mtu 4096), rxe0 on it
  ip link set eth1 mtu 9000
  ip addr add "$wire" dev eth1
  ip link set eth1 up
  netdev=eth1 ip=${wire%/*}
else
  netdev=eth0 ip=10.0.2.15
fi
rdma link add rxe0 type rxe netdev $netdev || echo "vm$id: rdma link add failed"
i=0
while [ $i -lt 300 ]; do
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && break
  sleep 0.1; i=$((i + 1))
done
echo "vm$id: rxe0 on $netdev port 1 $(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null || echo missing) at $(t) s" | tee /share/vm$id.boot
script=run.sh
[ -n "$id" ] && [ -f /share/run$id.sh ] && script=run$id.sh
export VM_ID=$id VM_IP=$ip PEER_IP=$peer
cd /share
sh ./$script >/share/vm$id.out 2>&1
echo $? >/share/vm$id.rc
echo "vm$id: $script exit $(cat /share/vm$id.rc) at $(t) s" | tee -a /share/vm$id.boot
cd /
sync
umount /share
poweroff -f
INIT
  } >"$1"
  chmod +x "$1"
}

vm_qemu_cmd() {
  local append=$1
  shift
  vm_cmd=(timeout -k 5 "${MLXDIST_VM_TIMEOUT:-400}" qemu-system-x86_64 -accel tcg -nographic -no-reboot
    -m 1024 -smp 1 -kernel "/boot/vmlinuz-$vm_kver" -initrd "$vm_work/initrd.gz"
    -append "console=ttyS0 panic=-1 loglevel=4 $append"
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile=
    -virtfs "local,path=$vm_share,mount_tag=share,security_model=none" "$@")
}
