#!/usr/bin/env bash
# Prints the directory the demo should mount on: DIR itself when nothing
# is mounted there, or when what is mounted there is a ztensor-mount mount
# whose daemon has died (reading it gives "Transport endpoint is not
# connected"), which is cleared with `BIN -u` first. Any other mount on DIR
# (a live one, someone else's, another file system) is left alone, and a
# new directory beside it is printed instead; stderr says why.
#
#   scripts/demo_mountpoint.sh DIR BIN
set -euo pipefail
dir=$1
bin=$2
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
dir=${dir%/}
# Without a mount on it, a missing directory is made (a dead mount answers
# mkdir with an error, and is dealt with below).
mkdir -p "$dir" 2>/dev/null || true

# The file system type of the last mount on $dir (mountinfo escapes space,
# tab, newline and backslash in octal), or nothing.
fstype_of() {
  local want=$1
  want=${want//\\/\\134}
  want=${want// /\\040}
  want=${want//$'\t'/\\011}
  want=${want//$'\n'/\\012}
  awk -v d="$want" '$5 == d { for (i = 7; i <= NF; i++) if ($i == "-") { t = $(i + 1); break } }
                    END { print t }' /proc/self/mountinfo
}

fstype=$(fstype_of "$dir")
if [ -z "$fstype" ]; then
  printf '%s\n' "$dir"
  exit 0
fi
why="$fstype is mounted there"
if [ "$fstype" = fuse.ztensor-mount ]; then
  why="a ztensor-mount mount with a live daemon is there"
  # Opening it asks the daemon (a stat may be answered from the kernel's
  # cache).
  said=$(LC_ALL=C ls -A "$dir" 2>&1 >/dev/null || true)
  if [[ $said == *"Transport endpoint is not connected"* ]]; then
    # Ours and dead: clear it and take the place (-u refuses another
    # user's mount, which then stays).
    if "$bin" -u "$dir" >/dev/null 2>&1 && [ -z "$(fstype_of "$dir")" ]; then
      echo "demo: cleared the dead ztensor-mount mount on $dir" >&2
      printf '%s\n' "$dir"
      exit 0
    fi
    why="a dead ztensor-mount mount that cannot be cleared here is there"
  fi
fi
other=$(mktemp -d "${dir%/}.XXXXXX")
echo "demo: not touching $dir ($why); mounting on $other instead" >&2
printf '%s\n' "$other"
