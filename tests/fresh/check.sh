#!/bin/sh
# tests/fresh/check.sh (make check-fresh): README's two commands on a fresh Debian 12, as a new
# user runs them. A minimal Debian 12 root (debootstrap --variant=minbase bookworm) gets only
# what README says a fresh machine needs before `make run` (TOOLS below) and a clean clone of
# HEAD (committed files only) in /root/shard; with /proc, /sys, /dev, /dev/pts and /dev/shm
# bound in, `make run` and then `make test` run inside it, stopping at the first that fails and
# naming it. Each step's output is shown and kept in FRESH_DIR/logs/.
# The root is built once and kept pristine in FRESH_DIR/pristine (git-ignored; rebuilt when
# missing or when TOOLS change; its package lists are dropped, as in Debian's container images,
# so make deps meets a machine that never ran apt-get update). Each check runs in a throwaway
# copy, FRESH_DIR/run: removed after a pass, kept after a failure for a look (the next check
# removes it). Everything mounted under it is unmounted on exit, also on failure or Ctrl-C.
# Needs root (debootstrap, chroot, mount) and the Debian mirror; installs debootstrap with
# apt-get when it is missing. About 7 minutes on 2 cores (apt, a full build, the test suite);
# building the root adds about a minute the first time.
# Knobs: FRESH_DIR=.fresh  FRESH_MIRROR=http://deb.debian.org/debian  FRESH_KEEP=1 (keep the
# run's root after a pass too).
set -u
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
cd "$(dirname "$0")/../.." || exit 2
REPO=$PWD

# README's "A fresh Debian 12 machine needs make, gcc and git" (Two commands): keep the two the same.
TOOLS="make gcc git"
SUITE=bookworm
MIRROR=${FRESH_MIRROR:-http://deb.debian.org/debian}
FRESH=$(realpath -m "${FRESH_DIR:-.fresh}")
PRISTINE=$FRESH/pristine
RUN=$FRESH/run
LOGS=$FRESH/logs
STAMP="debootstrap --variant=minbase $SUITE; apt-get install $TOOLS"

say() { echo "check-fresh: $*"; }
die() { echo "check-fresh: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mount): sudo make check-fresh"
case $FRESH in *[[:space:]]*) die "FRESH_DIR must not contain blanks: '$FRESH'" ;; esac
case $FRESH in /|/bin|/boot|/dev|/etc|/home|/lib*|/proc|/root|/run|/sbin|/sys|/tmp|/usr|/var)
  die "FRESH_DIR=$FRESH: not a folder to remove and rebuild" ;; esac

# The mount points at and under $1, deepest first (as /proc/self/mounts lists them).
mounts_under() {
  awk -v d="$1" '$2 == d || substr($2, 1, length(d) + 1) == d "/" { print $2 }' /proc/self/mounts | sort -r
}
# Unmounts everything at and under $1 (make test's network namespaces leave /run/netns mounted too).
unmount_under() {
  for m in $(mounts_under "$1"); do
    umount "$m" 2>/dev/null || umount -l "$m" || echo "check-fresh: cannot unmount $m" >&2
  done
}
# Removes the root $1, only once nothing is mounted under it: a bound /dev must never be emptied.
remove_root() {
  [ -e "$1" ] || return 0
  unmount_under "$1"
  [ -z "$(mounts_under "$1")" ] || die "still mounted under $1: $(mounts_under "$1" | tr '\n' ' ')"
  rm -rf --one-file-system "$1"
}
bind_system() {   # ROOT: the host's /proc, /sys, /dev, /dev/pts and /dev/shm, bound in
  # ROOT bound on itself first: its / is then a mount point, as a machine's is (ip netns exec,
  # in make test's multi-host tests, makes / a slave mount and fails on a plain folder).
  mount --bind "$1" "$1" && mount --make-private "$1" || die "cannot bind $1 on itself"
  for m in /proc /sys /dev /dev/pts /dev/shm; do
    mkdir -p "$1$m" && mount --bind "$m" "$1$m" || die "cannot bind $m into $1"
    mount --make-private "$1$m" 2>/dev/null   # what is mounted under it stays off the host's
  done
  # Name resolution as the host has it (apt reaches the mirror; mpirun resolves its host name).
  cp -L /etc/resolv.conf "$1/etc/resolv.conf" 2>/dev/null
  cp -L /etc/hosts "$1/etc/hosts" 2>/dev/null
  return 0
}
# ROOT COMMAND: COMMAND by /bin/sh inside ROOT as root, in /root/shard when it exists, with
# nothing of this shell's environment.
in_root() {
  chroot "$1" /usr/bin/env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/sh LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/sh -c 'cd /root/shard 2>/dev/null || cd /root; eval "$1"' sh "$2"
}
trap 'unmount_under "$PRISTINE.new"; unmount_under "$RUN"' EXIT
trap 'exit 130' INT TERM

if ! command -v debootstrap >/dev/null 2>&1; then
  say "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends debootstrap ||
    { apt-get update && apt-get install -y --no-install-recommends debootstrap; } ||
    die "cannot install debootstrap (apt-get install debootstrap)"
fi
mkdir -p "$FRESH" "$LOGS" || exit 1
start=$(date +%s)

# ---- the pristine root ------------------------------------------------------------------------
if [ "$(cat "$PRISTINE/.check-fresh" 2>/dev/null)" != "$STAMP" ]; then
  say "building the Debian 12 root in $PRISTINE ($STAMP)"
  remove_root "$PRISTINE.new"
  remove_root "$PRISTINE"
  debootstrap --variant=minbase "$SUITE" "$PRISTINE.new" "$MIRROR" >"$LOGS/debootstrap.log" 2>&1 ||
    { tail -n 30 "$LOGS/debootstrap.log" >&2; die "debootstrap failed (log: $LOGS/debootstrap.log)"; }
  bind_system "$PRISTINE.new"
  # As README's reader types it: apt-get install with Debian's defaults (recommends included).
  in_root "$PRISTINE.new" "export DEBIAN_FRONTEND=noninteractive; apt-get update && apt-get install -y $TOOLS &&
    apt-get clean && rm -rf /var/lib/apt/lists/*" >"$LOGS/tools.log" 2>&1 ||
    { tail -n 30 "$LOGS/tools.log" >&2; die "installing $TOOLS in the root failed (log: $LOGS/tools.log)"; }
  unmount_under "$PRISTINE.new"
  echo "$STAMP" >"$PRISTINE.new/.check-fresh"
  mv "$PRISTINE.new" "$PRISTINE" || exit 1
  say "root built in $(( $(date +%s) - start )) s"
fi

# ---- a throwaway copy, a clean clone of HEAD ------------------------------------------------
remove_root "$RUN"
cp -a "$PRISTINE" "$RUN" || die "cannot copy $PRISTINE to $RUN"
git clone -q --no-hardlinks "$REPO" "$RUN/root/shard" || die "cannot clone $REPO"
say "a clean clone of $(git -C "$RUN/root/shard" log -1 --format='%h %s' | cut -c1-100)"
bind_system "$RUN"

for step in "make run" "make test"; do
  log=$LOGS/$(echo "$step" | tr ' ' '-').log
  say "---- $step ----"
  t0=$(date +%s)
  # the step's status through the pipe (sh has no pipefail)
  { in_root "$RUN" "$step" 2>&1; echo $? >"$log.rc"; } | tee "$log"
  rc=$(cat "$log.rc"); rm -f "$log.rc"
  if [ "$rc" -ne 0 ]; then
    say "FAILED: '$step' exited $rc after $(( $(date +%s) - t0 )) s (log: $log; the root is kept in $RUN)"
    exit 1
  fi
  say "'$step' passed in $(( $(date +%s) - t0 )) s"
done
say "$(tail -n 1 "$LOGS/make-test.log")"
say "passed: make run, then make test, on a fresh Debian 12 in $(( $(date +%s) - start )) s"
unmount_under "$RUN"
[ "${FRESH_KEEP:-0}" = 1 ] || remove_root "$RUN"
exit 0
