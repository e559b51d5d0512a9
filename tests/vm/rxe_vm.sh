#!/usr/bin/env bash
# Boot a small Linux VM with a soft-RoCE device (rdma_rxe on eth0) and run a
# script in it: the project's harness for tests on real verbs (issue 23).
#   usage: tests/vm/rxe_vm.sh SHARE_DIR [ELF...]
# SHARE_DIR must hold run.sh. The VM mounts SHARE_DIR (9p, read-write) at
# /share, loads the modules, gives eth0 10.0.2.15/24, runs
# `rdma link add rxe0 type rxe netdev eth0`, waits (at most 30 s) for port 1
# to be ACTIVE, then runs `sh run.sh` in /share with the output in
# SHARE_DIR/vm.out and its exit status in SHARE_DIR/vm.rc, and powers off.
# Every ELF named (and every ELF directly in SHARE_DIR) has the shared
# libraries ldd finds for it copied into the initramfs at the same paths, so
# build-tree programs run unchanged (their RUNPATH into the build tree too).
# Exit: run.sh's status; 77 (skip) without root, qemu, the Debian kernel
# package (linux-image-amd64) or the tools; 1 when the VM did not finish
# (the console log is printed). MLXDIST_VM_TIMEOUT bounds the whole VM run
# (default 400 s; a run measured 35-60 s under TCG emulation).
set -euo pipefail
share=${1:?usage: rxe_vm.sh SHARE_DIR [ELF...]}
shift
share=$(cd "$share" && pwd)
skip() { echo "rxe_vm: SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (the initramfs copies system files; run as root)"
command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64 (apt-get install qemu-system-x86)"
kver=
for k in /boot/vmlinuz-*; do
  [ -f "$k" ] || continue
  v=${k#/boot/vmlinuz-}
  [ -f "/lib/modules/$v/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko" ] ||
    [ -f "/lib/modules/$v/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz" ] || continue
  kver=$v
done
[ -n "$kver" ] || skip "no kernel with rdma_rxe in /boot and /lib/modules (apt-get install linux-image-amd64)"
for t in busybox kmod rdma cpio ldd; do
  command -v $t >/dev/null || skip "no $t (scripts/setup-debian.sh installs it)"
done
[ -n "$(busybox --list 2>/dev/null | grep -x poweroff)" ] || skip "busybox lacks applets (apt-get install busybox-static)"
[ -f /etc/libibverbs.d/rxe.driver ] && ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-*.so >/dev/null 2>&1 ||
  skip "no soft-RoCE provider (apt-get install ibverbs-providers)"
[ -f "$share/run.sh" ] || { echo "rxe_vm: $share/run.sh is missing" >&2; exit 2; }

t0=$(date +%s.%N)
work=$(mktemp -d /tmp/mlxdist-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,sbin,proc,sys,dev,share,tmp,etc,run}
cp -L "$(command -v busybox)" "$root/bin/busybox"
cp -L "$(command -v kmod)" "$root/sbin/kmod"
ln -s kmod "$root/sbin/modprobe"
ln -s kmod "$root/sbin/insmod"
cp -L "$(command -v rdma)" "$root/sbin/rdma"

# Shared libraries at the paths ldd names (ld.so, libc, libibverbs, libmlxdist.so...)
copy_libs() {
  ldd "$1" 2>/dev/null | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}' | while read -r lib; do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}
elfs=("$root/sbin/kmod" "$root/sbin/rdma")
mkdir -p "$root/etc/libibverbs.d" "$root/usr/lib/x86_64-linux-gnu/libibverbs"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
for p in /usr/lib/x86_64-linux-gnu/libibverbs/librxe-*.so; do
  cp -L "$p" "$root/usr/lib/x86_64-linux-gnu/libibverbs/"
  elfs+=("$p")
done
lib=$(ldconfig -p | awk '/libibverbs.so.1 / && !f {print $NF; f = 1}')
[ -n "$lib" ] || skip "no libibverbs.so.1 (apt-get install libibverbs1)"
mkdir -p "$root$(dirname "$lib")"
cp -L "$lib" "$root$lib"
elfs+=("$lib")
for u in ibv_rc_pingpong ibv_devinfo; do  # ibverbs-utils, when installed
  command -v $u >/dev/null || continue
  cp -L "$(command -v $u)" "$root/bin/$u"
  elfs+=("$root/bin/$u")
done
for f in "$@" "$share"/*; do
  [ -f "$f" ] && [ "$(head -c4 "$f" 2>/dev/null | tail -c3)" = ELF ] && elfs+=("$f")
done
for e in "${elfs[@]}"; do copy_libs "$e"; done

# The modules rdma_rxe (and crc32_generic: rxe asks the crypto API for "crc32", an ENOENT
# "failed to add eth0" without it), 9p over virtio and virtio_net need, with their dependencies.
mods=(virtio_pci virtio_net 9pnet_virtio 9p crc32_generic rdma_rxe ib_uverbs)
mkdir -p "$root/lib/modules/$kver"
cp /lib/modules/"$kver"/modules.{dep,dep.bin,alias,alias.bin,softdep,symbols,symbols.bin,builtin,builtin.bin,builtin.modinfo,order} \
  "$root/lib/modules/$kver/" 2>/dev/null || true
for m in "${mods[@]}"; do
  modprobe -S "$kver" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | sort -u | while read -r ko; do
  mkdir -p "$root$(dirname "$ko")"
  cp "$ko" "$root$ko"
done

cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev  # /dev/infiniband/uverbs0 appears here: no udev needed
mount -t tmpfs tmpfs /tmp
t() { cut -d' ' -f1 /proc/uptime; }
echo "vm: init at $(t) s"
for m in virtio_pci virtio_net 9pnet_virtio 9p crc32_generic rdma_rxe ib_uverbs; do
  modprobe $m || echo "vm: modprobe $m failed"
done
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /share; then
  echo "vm: cannot mount the share"; poweroff -f
fi
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
rdma link add rxe0 type rxe netdev eth0 || echo "vm: rdma link add failed"
i=0
while [ $i -lt 300 ]; do
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && break
  sleep 0.1; i=$((i + 1))
done
echo "vm: rxe0 port 1 $(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null || echo missing) at $(t) s" | tee /share/vm.boot
cd /share
sh ./run.sh >/share/vm.out 2>&1
echo $? >/share/vm.rc
echo "vm: run.sh exit $(cat /share/vm.rc) at $(t) s" | tee -a /share/vm.boot
cd /
sync
umount /share
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 >"$work/initrd.gz")
t1=$(date +%s.%N)
echo "rxe_vm: kernel $kver, initramfs $(du -k "$work/initrd.gz" | cut -f1) KiB built in $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s"

rm -f "$share/vm.rc" "$share/vm.out" "$share/vm.boot" "$share/vm.console"
rc=0
timeout -k 5 "${MLXDIST_VM_TIMEOUT:-400}" qemu-system-x86_64 -accel tcg -nographic -no-reboot \
  -m 1024 -smp 1 -kernel "/boot/vmlinuz-$kver" -initrd "$work/initrd.gz" \
  -append "console=ttyS0 panic=-1 loglevel=4" \
  -netdev user,id=n0 -device virtio-net-pci,netdev=n0 \
  -virtfs "local,path=$share,mount_tag=share,security_model=none" \
  </dev/null >"$work/console.log" 2>&1 || rc=$?
t2=$(date +%s.%N)
cp "$work/console.log" "$share/vm.console" 2>/dev/null || true
echo "rxe_vm: VM ran $(awk "BEGIN{printf \"%.1f\", $t2 - $t1}") s (qemu exit $rc)"
[ -f "$share/vm.boot" ] && cat "$share/vm.boot"
if [ ! -f "$share/vm.rc" ]; then
  echo "rxe_vm: the VM did not finish run.sh (qemu exit $rc$([ $rc = 124 ] && echo ": timed out after ${MLXDIST_VM_TIMEOUT:-400} s")); console:"
  tail -n 60 "$work/console.log"
  exit 1
fi
exit "$(cat "$share/vm.rc")"
