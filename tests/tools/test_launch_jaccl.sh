#!/bin/sh
# mlxdist-launch --backend jaccl|jaccl-ring with real processes: on this host
# and across hosts through the stand-in ssh (fake_ssh.sh; hosts 127.0.0.2 and
# 127.0.0.3 are this machine's loopback). No RDMA is needed: a rank program
# (a sh script written here) prints the jaccl variables it got and its matrix
# file (contents, mode, its directory's mode); hosts_rank.c does a strict
# jaccl init.
#   test_launch_jaccl.sh CASE LAUNCHER HOSTS_RANK FAKE_SSH
# Cases:
#   local    -n from --ibv-devices' matrix: both ranks get MLX_RANK, the matrix's
#            path, one coordinator 127.0.0.1:P (P bound, not 32323), no ring flag;
#            JACCL_RANK / MLX_JACCL_RING / MLX_HOSTFILE of the launcher do not leak;
#            --coordinator-port P is used as given
#   ring     jaccl-ring with MLX_IBV_DEVICES from the environment: MLX_JACCL_RING=1
#   nomatrix jaccl on this host with no matrix: one clear error, exit 2;
#            -n disagreeing with the matrix: named, exit 2
#   hosts    MLX's hostfile with "rdma" lists, 3 entries (127.0.0.3 twice): every
#            rank's matrix (rows = entries) in its own 0600 file in a 0700
#            directory, removed when the job ends; the coordinator 127.0.0.2:P with
#            P in --port-range; the backend taken from the hostfile
#   mixed    localhost first (coordinator bound here) and 127.0.0.2 over ssh,
#            jaccl-ring: both files removed at the end
#   busy     the first host's only allowed port is in use there: the probe says
#            so, nothing starts; a busy --coordinator-port, there and here, the same
#   bad      malformed "rdma" fields, each its own named error, exit 2
#   init     a strict jaccl init under the launcher fails with jaccl's own reason
#            (no RDMA device / no libibverbs), and the launcher reports it
#   signal   SIGTERM to the launcher while ranks run: the matrix file is removed
set -u
case_=$1
launch=$2
hrank=$3
fake="sh $4"
dir=$(mktemp -d)
out=$dir/out
lpid=
trap '[ -z "$lpid" ] || kill "$lpid" 2>/dev/null; rm -rf "$dir"' EXIT
fail=0
unset MLX_HOSTFILE MLXDIST_LAUNCH_TIMEOUT MLX_IBV_DEVICES JACCL_IBV_DEVICES MLX_JACCL_RING \
  JACCL_RING JACCL_RANK MLX_JACCL_COORDINATOR JACCL_COORDINATOR FAKE_SSH_DOWN FAKE_SSH_GONE

# the rank program: one line with everything it got
prog=$dir/rank.sh
cat >"$prog" <<'EOF'
#!/bin/sh
f=${MLX_IBV_DEVICES-}
m=-
[ -n "$f" ] && m="$(stat -c %a "$f") $(stat -c %a "$(dirname "$f")") $(cat "$f")"
echo "rank=${MLX_RANK-} world=${MLX_WORLD_SIZE-} coord=${MLX_JACCL_COORDINATOR-} ring=${MLX_JACCL_RING-unset} jrank=${JACCL_RANK-unset} hostfile=${MLX_HOSTFILE-unset} file=$f modes+matrix=$m"
[ "${1-}" = sleep ] && exec sleep 30
exit 0
EOF
chmod 755 "$prog"

check() { # check DESCRIPTION GREP-PATTERN
  if grep -E -q -- "$2" "$out"; then
    echo "ok: $1"
  else
    echo "FAIL: $1 (no line matches: $2)"
    fail=1
  fi
}

check_not() {
  if grep -E -q -- "$2" "$out"; then
    echo "FAIL: $1 (a line matches: $2)"
    fail=1
  else
    echo "ok: $1"
  fi
}

run() { # run EXPECTED-STATUS ARGS...
  want=$1
  shift
  "$launch" "$@" >"$out" 2>&1
  rc=$?
  sed 's/^/    | /' "$out"
  echo "exit $rc"
  if [ "$want" = nz ] && [ "$rc" -ne 0 ]; then
    :
  elif [ "$want" = nz ] || [ "$rc" -ne "$want" ]; then
    echo "FAIL: exit status $rc, expected $want"
    fail=1
  fi
}

# The files the ranks named are gone (the job ended).
files_gone() {
  n=0
  for f in $(sed -n 's/.* file=\([^ ]*\) .*/\1/p' "$out"); do
    n=$((n + 1))
    if [ -e "$f" ] || [ -e "$(dirname "$f")" ]; then
      echo "FAIL: $f (or its directory) is still there"
      fail=1
    fi
  done
  if [ "$n" -ge "$1" ]; then echo "ok: $n matrix files, all removed"; else
    echo "FAIL: $n matrix files named, expected $1"
    fail=1
  fi
}

same_coord() { # every rank the same coordinator, not MLX's fixed 32323
  n=$(sed -n 's/.* coord=\([^ ]*\) .*/\1/p' "$out" | sort -u | wc -l)
  c=$(sed -n 's/.* coord=\([^ ]*\) .*/\1/p' "$out" | sort -u | head -1)
  if [ "$n" -eq 1 ] && [ "${c##*:}" != 32323 ] && [ "${c##*:}" -gt 0 ]; then
    echo "ok: one coordinator $c"
  else
    echo "FAIL: coordinators: $(sed -n 's/.* coord=\([^ ]*\) .*/\1/p' "$out" | tr '\n' ' ')"
    fail=1
  fi
}

m2=$dir/m2.json
printf '[[null, "rxe0"],\n ["rxe1", null]]\n' >"$m2"
chmod 644 "$m2"

case $case_ in
  local)
    JACCL_RANK=9 MLX_JACCL_RING=1 MLX_HOSTFILE=/nonexistent run 0 --backend jaccl \
      --ibv-devices "$m2" --timeout 30 -- "$prog"
    for r in 0 1; do
      check "rank $r" "^\[$r\] rank=$r world=2 coord=127\.0\.0\.1:[0-9]+ ring=unset jrank=unset hostfile=unset file=$m2 modes\+matrix=644 [0-9]+ \[\[null, \"rxe0\"\],"
    done
    same_coord
    # a port below the ephemeral range (no other test's connection is handed it), free now
    port=$((24000 + $$ % 1000))
    while ss -Htln "sport = :$port" | grep -q .; do port=$((port + 1)); done
    run 0 --backend jaccl --ibv-devices "$m2" --coordinator-port "$port" --timeout 30 -- "$prog"
    check "--coordinator-port" "^\[0\] rank=0 world=2 coord=127\.0\.0\.1:$port "
    ;;
  ring)
    MLX_IBV_DEVICES=$m2 run 0 --backend jaccl-ring --timeout 30 -- "$prog"
    for r in 0 1; do check "rank $r: ring" "^\[$r\] rank=$r world=2 coord=127\.0\.0\.1:[0-9]+ ring=1 "; done
    ;;
  nomatrix)
    run 2 --backend jaccl -n 2 -- "$prog"
    check "a matrix is needed" "^\[launch\] jaccl on this host needs the device matrix .*give --ibv-devices FILE or set MLX_IBV_DEVICES"
    run 2 --backend jaccl -n 3 --ibv-devices "$m2" -- "$prog"
    check "-n vs the matrix" "^\[launch\] -n 3 disagrees with the device matrix '.*m2\.json' \(--ibv-devices\): it has 2 rows"
    printf '[[null, "rxe0"], ["rxe1", "rxe1"]]' >"$dir/diag.json"
    run 2 --backend jaccl --ibv-devices "$dir/diag.json" -- "$prog"
    check "a bad matrix file" "^\[launch\] --ibv-devices: device matrix '.*diag\.json': row 1, column 1 is on the diagonal"
    run 2 --backend jaccl --hostfile "$m2" -- "$prog"
    check "a matrix given as --hostfile" "^\[launch\] jaccl: --hostfile '.*' is not a hostfile of hosts"
    ;;
  hosts)
    cat >"$dir/h.json" <<'EOF'
{"backend": "jaccl", "envs": ["K=V"], "hosts": [
  {"ssh": "127.0.0.2", "ips": ["127.0.0.2"], "rdma": [null, "rxe0", ["mlx5_0", "mlx5_1"]]},
  {"ssh": "127.0.0.3", "rdma": ["rxe1", null, "rxe2"]},
  {"ssh": "127.0.0.3", "rdma": ["a.b", "c-d", null]}]}
EOF
    run 0 --ssh "$fake" --hostfile "$dir/h.json" --port-range 31000-31999 --timeout 30 -- "$prog"
    mx='\[\[null,"rxe0",\["mlx5_0","mlx5_1"\]\],\["rxe1",null,"rxe2"\],\["a\.b","c-d",null\]\]'
    for r in 0 1 2; do
      check "rank $r: its matrix 0600 in a 0700 directory" "^\[$r\] rank=$r world=3 coord=127\.0\.0\.2:31[0-9]{3} ring=unset jrank=unset hostfile=unset file=[^ ]*/mlxdist-jaccl\.[A-Za-z0-9]+/devices\.json modes\+matrix=600 700 $mx$"
    done
    same_coord
    files_gone 3
    ;;
  mixed)
    cat >"$dir/h.json" <<'EOF'
[{"ssh": "localhost", "rdma": [null, "rxe0"]}, {"ssh": "127.0.0.2", "rdma": ["rxe1", null]}]
EOF
    log=$dir/ssh.log
    FAKE_SSH_LOG=$log run 0 --ssh "$fake" --hostfile "$dir/h.json" --backend jaccl-ring --verbose \
      --timeout 30 -- "$prog"
    check "the plan" "^\[launch\] starting 2 ranks of '.*' on 2 hosts; jaccl-ring, coordinator 127\.0\.0\.1:[0-9]+$"
    check "rank 0 local" "^\[0 localhost\] rank=0 world=2 coord=127\.0\.0\.1:[0-9]+ ring=1 .* modes\+matrix=600 700 \[\[null,\"rxe0\"\],\[\"rxe1\",null\]\]$"
    check "rank 1 over ssh" "^\[1 127\.0\.0\.2\] rank=1 world=2 coord=127\.0\.0\.1:[0-9]+ ring=1 .* modes\+matrix=600 700 "
    same_coord
    files_gone 2
    if [ "$(grep -c . "$log")" -eq 1 ]; then echo "ok: one ssh (the rank; no probe for a local first host)"; else
      echo "FAIL: ssh calls: $(cat "$log")"
      fail=1
    fi
    ;;
  busy)
    "$hrank" listen >"$dir/listen" &
    lpid=$!
    i=0
    while ! grep -q port "$dir/listen" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    p=$(sed -n 's/port //p' "$dir/listen")
    cat >"$dir/h.json" <<'EOF'
[{"ssh": "127.0.0.2", "rdma": [null, "rxe0"]}, {"ssh": "127.0.0.3", "rdma": ["rxe1", null]}]
EOF
    run nz --ssh "$fake" --hostfile "$dir/h.json" --backend jaccl --port-range "$p-$p" -- "$prog"
    check "no free port in the range" "^\[launch\] jaccl: host 127\.0\.0\.2 has no free port in $p-$p \(every one is in use by a socket there\)"
    check_not "nothing started" "^\[[0-9]\] rank="
    run nz --ssh "$fake" --hostfile "$dir/h.json" --backend jaccl --coordinator-port "$p" -- "$prog"
    check "--coordinator-port in use" "^\[launch\] jaccl: --coordinator-port $p is in use on host 127\.0\.0\.2\.$"
    run nz --backend jaccl --ibv-devices "$m2" --coordinator-port "$p" -- "$prog"
    check "--coordinator-port in use here" "^\[launch\] jaccl: cannot listen on 127\.0\.0\.1 port $p \(--coordinator-port\): Address already in use\.$"
    kill "$lpid"
    wait "$lpid" 2>/dev/null
    lpid=
    ;;
  bad)
    n=0
    bad() { # bad DESCRIPTION HOSTS-JSON EXPECTED-MESSAGE-PATTERN [launcher options]
      n=$((n + 1))
      printf '%s\n' "$2" >"$dir/b$n.json"
      d=$1
      pat=$3
      shift 3
      run 2 --ssh "$fake" --hostfile "$dir/b$n.json" --backend jaccl "$@" -- "$prog"
      check "$d" "^\[launch\] $pat"
      check_not "$d: nothing started" "^\[[0-9]\] rank="
    }
    A='{"ssh": "127.0.0.2"'
    B='{"ssh": "127.0.0.3"'
    bad "no rdma" "[$A, \"rdma\": [null, \"x\"]}, $B}]" \
      "hostfile '.*b1\.json', host 1 \(127\.0\.0\.3\) has no \"rdma\" list \(jaccl needs one per host: 2 entries"
    bad "too short" "[$A, \"rdma\": [null]}, $B, \"rdma\": [\"x\", null]}]" \
      "hostfile '.*', host 0 \(127\.0\.0\.2\): \"rdma\" has 1 entries, expected 2 \(one per host"
    bad "diagonal" "[$A, \"rdma\": [\"x\", \"y\"]}, $B, \"rdma\": [\"x\", null]}]" \
      "hostfile '.*', host 0 \(127\.0\.0\.2\): \"rdma\" entry 0 is the host itself and must be null, got a string"
    bad "bad character" "[$A, \"rdma\": [null, \"mlx5/0\"]}, $B, \"rdma\": [\"x\", null]}]" \
      "hostfile '.*', host 0 \(127\.0\.0\.2\): \"rdma\" entry 1: the device name 'mlx5' has the character '/'"
    bad "empty name" "[$A, \"rdma\": [null, \"x\"]}, $B, \"rdma\": [[\"a\", \"\"], null]}]" \
      "hostfile '.*', host 1 \(127\.0\.0\.3\): \"rdma\" entry 0 item 1 is an empty string"
    bad "not a string" "[$A, \"rdma\": [null, [\"a\", 3]]}, $B, \"rdma\": [\"x\", null]}]" \
      "hostfile '.*', host 0 \(127\.0\.0\.2\): \"rdma\" entry 1 item 1 is a number \(expected a device name\)"
    bad "an object" "[$A, \"rdma\": [null, {}]}, $B, \"rdma\": [\"x\", null]}]" \
      "hostfile '.*', host 0 \(127\.0\.0\.2\): \"rdma\" entry 1 is an object \(expected null, a device name or a list of names\)"
    bad "not a list" "[$A, \"rdma\": \"x\"}, $B, \"rdma\": [\"x\", null]}]" \
      "hostfile '.*', host 0 \(127\.0\.0\.2\): \"rdma\" is a string \(expected a list of 2 entries"
    bad "too long" "[$A, \"rdma\": [null, \"$(printf 'n%.0s' $(seq 64))\"]}, $B, \"rdma\": [\"x\", null]}]" \
      "hostfile '.*', host 0 \(127\.0\.0\.2\): \"rdma\" entry 1: the device name 'n{24}\.\.\.' is 64 characters long \(expected at most 63\)"
    bad "twice in a cell" "[$A, \"rdma\": [null, [\"a\", \"a\"]]}, $B, \"rdma\": [\"x\", null]}]" \
      "device matrix 'the \"rdma\" lists of hostfile '.*' \(row = host\)': row 0, column 1 names 'a' twice"
    bad "two ranks on an entry" "[$A, \"rdma\": [null, \"x\"]}, $B, \"rdma\": [\"x\", null]}]" \
      "hostfile '.*', host 0 \(127\.0\.0\.2\) has 2 ranks \(its slots or -n\), but jaccl runs one rank per host entry" \
      -n 2
    C='{"ssh": "127.0.0.4"'
    bad "neither mesh nor ring" \
      "[$A, \"rdma\": [null, \"x\", null, null]}, $B, \"rdma\": [\"x\", null, \"y\", null]}, $C, \"rdma\": [null, \"y\", null, \"z\"]}, {\"ssh\": \"127.0.0.5\", \"rdma\": [null, null, \"z\", null]}]" \
      "device matrix 'the \"rdma\" lists of hostfile '.*' \(row = host\)' is neither a mesh nor a ring"
    run 2 --ssh "$fake" --hosts 127.0.0.2,127.0.0.3 --backend jaccl -- "$prog"
    check "--hosts has no matrix" "^\[launch\] jaccl needs the device matrix: give a hostfile whose hosts have \"rdma\" lists"
    run 2 --backend nccl -n 2 -- "$prog"
    check "backend names" "^\[launch\] --backend must be 'ring', 'mpi', 'jaccl' or 'jaccl-ring', got 'nccl'\.$"
    ;;
  init)
    run nz --backend jaccl --ibv-devices "$m2" --timeout 30 -- "$hrank" jaccl
    # this machine has no RDMA: jaccl's own reason, past its configuration checks
    check "jaccl's reason" "^\[0\] .*\[jaccl\] .*(no such RDMA device|no RDMA device|no libibverbs|no active port|not a usable libibverbs)"
    check_not "the configuration was accepted" "configuration is missing|bad coordinator|is out of range|cannot open the device matrix|device matrix '[^']*': row"
    check "the launcher names the failure" "^\[launch\] first failure: rank [01]"
    check_not "no init succeeded" "jaccl init ok"
    ;;
  signal)
    # two local entries: the launcher writes the matrix; SIGTERM while the ranks run
    cat >"$dir/h.json" <<'EOF'
[{"ssh": "localhost", "rdma": [null, "rxe0"]}, {"ssh": "127.0.0.1", "rdma": ["rxe1", null]}]
EOF
    "$launch" --hostfile "$dir/h.json" --backend jaccl -- "$prog" sleep >"$out" 2>&1 &
    lpid=$!
    i=0
    while [ "$(grep -c 'rank=' "$out")" -lt 2 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    f=$(sed -n 's/.* file=\([^ ]*\) .*/\1/p' "$out" | head -1)
    if [ -n "$f" ] && [ -f "$f" ]; then echo "ok: the matrix file is there while the job runs"; else
      echo "FAIL: no matrix file while the job runs ($f)"
      fail=1
    fi
    kill -TERM "$lpid"
    wait "$lpid"
    rc=$?
    lpid=
    sed 's/^/    | /' "$out"
    echo "exit $rc"
    files_gone 2
    ;;
  *)
    echo "unknown case $case_"
    exit 2
    ;;
esac
exit $fail
