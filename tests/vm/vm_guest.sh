# Functions for the scripts that run inside the soft-RoCE VMs (busybox sh),
# sourced from the share: `. ./vm_guest.sh` (the test scripts copy it there).
fail=0
no() {
  echo "FAIL: $*"
  fail=1
}
now_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }

# gid_index DEV IP: the index of DEV port 1's RoCE v2 GID for the IPv4
# address IP, chosen by content (the index depends on timing: an fe80 or
# fec0 entry can come first); empty when there is none.
gid_index() {
  want=$(echo "$2" | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4}')
  for g in /sys/class/infiniband/$1/ports/1/gids/*; do
    n=${g##*/}
    [ "$(cat "$g" 2>/dev/null)" = "$want" ] || continue
    [ "$(cat /sys/class/infiniband/$1/ports/1/gid_attrs/types/$n 2>/dev/null)" = "RoCE v2" ] || continue
    echo "$n"
    return 0
  done
}

# retry SECONDS CMD...: run CMD every second until it exits 0 or SECONDS pass
# (a client started before its server listens); the last status otherwise.
retry() {
  end=$(($(now_ms) + $1 * 1000))
  shift
  while :; do
    "$@" && return 0
    r=$?
    [ "$(now_ms)" -lt "$end" ] || return $r
    sleep 1
  done
}

# barrier NAME [SECONDS]: two VMs sharing /share (rxe_vm2.sh) wait for each
# other (at most SECONDS, default 120): each leaves /share/barrier.NAME.ID and
# waits for the other's. At the end of a script, so that neither VM powers off
# while the other's processes still talk to it (a host that vanishes leaves
# its peers' last TCP bytes unacknowledged: they wait MLXDIST_TIMEOUT).
barrier() {
  : >"/share/barrier.$1.$VM_ID"
  other=$((3 - VM_ID))
  end=$(($(now_ms) + ${2:-120} * 1000))
  while [ ! -e "/share/barrier.$1.$other" ]; do
    if [ "$(now_ms)" -ge "$end" ]; then
      echo "barrier $1: VM $other did not come within ${2:-120} s"
      return 1
    fi
    sleep 0.1
  done
}
