#!/usr/bin/env bash
# Remote reads, measured against the local Range server of the tests
# (tests/python/range_server.py, on 127.0.0.1): a file with one raw tensor
# of SIZE_MIB (default 1024) MiB, mounted as http://127.0.0.1:PORT/model.zt.
# Prints, for each block size: the first sequential read of the tensor
# through the mount (cold cache file), the same bytes fetched by curl with
# 4 parallel ranged GETs of that size from the same server, the time to the
# first byte of a read in the middle (fresh mount), a second read (from the
# disk cache), a read after a remount, and the daemon's peak RSS.
#
#   bash scripts/bench_remote.sh                 # the debug build, 1 GiB
#   ZT_BIN=target/release/ztensor-mount SIZE_MIB=256 bash scripts/bench_remote.sh
#   BLOCKS=4M MOUNT_OPTS=remote_read_ahead=8 bash scripts/bench_remote.sh
#   LATENCY_MS=30 bash scripts/bench_remote.sh   # each GET answers 30 ms late
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bin=${ZT_BIN:-$root/target/debug/ztensor-mount}
py=${ZT_PYTHON:-$root/.venv/bin/python}
size_mib=${SIZE_MIB:-1024}
blocks=${BLOCKS:-1M 4M 8M}
work=$(mktemp -d /var/tmp/zt-bench-remote.XXXXXX)
mnt=$work/mnt
mkdir -p "$work/files" "$mnt"
srv_pid=
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || true
  [ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$py" -c "import numpy as np, sys; np.save(sys.argv[1], np.frombuffer(np.random.default_rng(1).bytes($size_mib << 20), dtype=np.uint8))" "$work/t.npy"
"$bin" pack "$work/files/model.zt" t="$work/t.npy" >/dev/null
rm "$work/t.npy"
bytes=$((size_mib << 20))

# Its stdin is the coprocess pipe: it serves until this script ends.
coproc SRV { exec "$py" tests/python/range_server.py "$work/files" "${LATENCY_MS:-0}"; }
srv_pid=$SRV_PID
read -r _ port <&"${SRV[0]}"
url=http://127.0.0.1:$port/model.zt

now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc -l | xargs printf '%.2f'; }
mibps() { echo "$bytes / 1048576 / ($2 - $1)" | bc -l | xargs printf '%.0f'; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

mount_it() { # block cache_dir
  "$bin" "$url" "$mnt" --cache-dir "$2" -o "block_size=$1${MOUNT_OPTS:+,$MOUNT_OPTS}" --log-file "$work/log"
}
daemon_pid() { pgrep -n -f "ztensor-mount $url $mnt" ; }

printf '%-6s %10s %10s %9s %10s %10s %9s\n' block "mount MiB/s" "curl MiB/s" "ttfb ms" "2nd MiB/s" "remount" "RSS MiB"
for block in $blocks; do
  bsz=$("$py" -c "import sys; s=sys.argv[1]; print(int(s[:-1]) << {'K':10,'M':20}[s[-1]])" "$block")
  cache=$work/cache-$block
  rm -rf "$cache"; mkdir -p "$cache"
  # The plain client: 4 parallel ranged GETs of one block each.
  cfg=$work/curl.cfg; : > "$cfg"
  # (The file is the tensor and 4 KiB or so of header and index.)
  for ((at = 0; at < bytes; at += bsz)); do
    [ "$at" -gt 0 ] && echo next >> "$cfg"
    printf 'silent\nurl = "%s"\nrange = "%d-%d"\noutput = "/dev/null"\n' "$url" "$at" "$((at + bsz - 1))" >> "$cfg"
  done
  t0=$(now); curl -s --parallel --parallel-max 4 -K "$cfg" 2>/dev/null; t1=$(now)
  curl_rate=$(mibps "$t0" "$t1")
  # The mount, cold: one sequential read.
  mount_it "$block" "$cache"
  t0=$(now); dd if="$mnt/t" of=/dev/null bs=4M status=none; t1=$(now)
  mount_rate=$(mibps "$t0" "$t1")
  # Again, from the cache file.
  drop_caches
  t0=$(now); dd if="$mnt/t" of=/dev/null bs=4M status=none; t1=$(now)
  second=$(mibps "$t0" "$t1")
  rss=$(($(awk '/VmHWM/ {print $2}' "/proc/$(daemon_pid)/status") / 1024))
  fusermount3 -u "$mnt"
  # A remount: nothing fetched but the pin.
  mount_it "$block" "$cache"
  t0=$(now); dd if="$mnt/t" of=/dev/null bs=4M status=none; t1=$(now)
  remount=$(mibps "$t0" "$t1")
  fusermount3 -u "$mnt"
  # Time to the first byte in the middle, on a fresh cache.
  rm -rf "$cache"; mkdir -p "$cache"
  mount_it "$block" "$cache"
  t0=$(now); dd if="$mnt/t" of=/dev/null bs=4096 count=1 skip=$((bytes / 2 / 4096)) status=none; t1=$(now)
  ttfb=$(echo "($t1 - $t0) * 1000" | bc -l | xargs printf '%.0f')
  fusermount3 -u "$mnt"
  printf '%-6s %10s %10s %9s %10s %10s %9s\n' "$block" "$mount_rate" "$curl_rate" "$ttfb" "$second" "$remount" "$rss"
done
