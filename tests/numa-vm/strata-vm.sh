#!/usr/bin/env bash
# strata-vm.sh - boot a throw-away QEMU guest with N virtual NUMA nodes, run one test binary in it as
# the only process, and exit with that binary's status.
#
#   strata-vm.sh [--nodes N] [--cpus-per-node K] [--mem MiB] [--timeout S] [--env K=V]... [--add FILE]...
#                BINARY [ARGS...]
# --add puts another program (with its libraries) next to BINARY in the guest's /test.
#
# How it stays fast without KVM (the container's /dev/kvm only runs PVM guests, so TCG it is):
#  - Debian's kernel package is fetched once with `apt-get download` into the cache
#    ($STRATA_VM_CACHE, default <repo>/.vm-cache, git-ignored) and its bzImage unpacked to the ELF
#    vmlinux, which QEMU boots through the PVH entry: no xz decompression under emulation.
#  - qboot instead of SeaBIOS, no default devices, no network, an uncompressed cpio initramfs holding
#    busybox, the binary and the shared libraries ldd names (plus libtbbbind, which oneTBB dlopens).
#  - numa_balancing=disable so the kernel never migrates pages behind a placement check.
# Exit: the binary's status; 77 when qemu, cpio or busybox is missing (ctest SKIP); 125 when the VM
# gave no result (crash, timeout); 2 on usage errors; 1 when the kernel cannot be obtained.
set -euo pipefail

nodes=2 per_node=2 mem=1024 timeout=240
envs=()
extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --cpus-per-node) per_node=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --add) extra+=("$(readlink -f "$2")"); shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "strata-vm.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || { echo "usage: strata-vm.sh [options] BINARY [ARGS...]" >&2; exit 2; }
binary=$(readlink -f "$1"); shift
[[ -x $binary ]] || { echo "strata-vm.sh: $binary is not an executable" >&2; exit 2; }

for tool in qemu-system-x86_64 cpio; do
  command -v "$tool" >/dev/null || { echo "strata-vm.sh: SKIP, $tool is not installed (apt-get install qemu-system-x86 cpio)" >&2; exit 77; }
done
[[ -x /bin/busybox ]] || { echo "strata-vm.sh: SKIP, /bin/busybox is missing (apt-get install busybox-static)" >&2; exit 77; }
bios=/usr/share/qemu/qboot.rom; [[ -e $bios ]] || bios=""

# ---- kernel (cached) ----------------------------------------------------------------------------
here=$(dirname "$(readlink -f "$0")")
cache=${STRATA_VM_CACHE:-$(readlink -f "$here/../..")/.vm-cache}
mkdir -p "$cache"
vmlinux=$cache/vmlinux
if [[ ! -s $vmlinux ]]; then
  exec 9>"$cache/.lock"; flock 9   # parallel ctest runs: one download
  if [[ ! -s $vmlinux ]]; then
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    [[ -n $pkg ]] || { echo "strata-vm.sh: apt-cache cannot resolve linux-image-amd64 (run apt-get update)" >&2; exit 1; }
    dl=$(mktemp -d); chmod 777 "$dl"   # apt-get download drops privileges to _apt
    if ! (cd "$dl" && apt-get download -q "$pkg" >&2); then rm -rf "$dl"; echo "strata-vm.sh: apt-get download $pkg failed" >&2; exit 1; fi
    dpkg-deb --fsys-tarfile "$dl"/*.deb | tar -x -O --wildcards './boot/vmlinuz-*' > "$cache/vmlinuz"
    rm -rf "$dl"
    # The bzImage carries the kernel as an xz stream: cut from its magic and decompress (xz warns about
    # the trailing bytes after the stream; the ELF is complete).
    offset=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$cache/vmlinuz" | head -1 | cut -d: -f1)
    tail -c +$((offset + 1)) "$cache/vmlinuz" | xz -dc > "$vmlinux.part" 2>/dev/null || true
    if head -c 4 "$vmlinux.part" | grep -q ELF; then mv "$vmlinux.part" "$vmlinux"; else rm -f "$vmlinux.part"; fi
    [[ -s $vmlinux ]] || cp "$cache/vmlinuz" "$vmlinux"   # fall back to the (slower) compressed image
  fi
  exec 9>&-
fi

# ---- initramfs ----------------------------------------------------------------------------------
work=$(mktemp -d /tmp/strata-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,dev,proc,sys,tmp,test}
cp /bin/busybox "$root/bin/busybox"

add_file() {  # add_file SRC DST: the file plus every shared library ldd lists for it, at their paths
  mkdir -p "$root$(dirname "$2")"; cp -L "$1" "$root$2"
  local lib
  for lib in $(ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    [[ -e $root$lib ]] && continue
    mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"
  done
}
add_file "$binary" "/test/$(basename "$binary")"
for f in "${extra[@]}"; do add_file "$f" "/test/$(basename "$f")"; done
tbb=$(ldd "$binary" | awk '/libtbb\.so/ {print $3; exit}')
if [[ -n $tbb ]]; then
  for bind in "$(dirname "$tbb")"/libtbbbind*.so.3; do [[ -e $bind ]] && add_file "$bind" "$bind"; done
fi

quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
command_line="./$(basename "$binary")"
for a in "$@"; do command_line+=" $(quote "$a")"; done
exports=""
for e in "${envs[@]}"; do exports+="export $(quote "$e")"$'\n'; done
cat > "$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin HOME=/tmp
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs dev /dev; mount -t tmpfs tmp /tmp
$exports
cd /test
echo "STRATA_VM_BEGIN nodes=\$(ls -d /sys/devices/system/node/node* | wc -l) uptime=\$(cut -d' ' -f1 /proc/uptime)"
$command_line
echo "STRATA_VM_STATUS=\$? uptime=\$(cut -d' ' -f1 /proc/uptime)"
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet) > "$work/initramfs.cpio"

# ---- NUMA layout: node i owns CPUs i*K .. i*K+K-1 and mem/N MiB; one socket per node ------------
per_mem=$(( mem / nodes )); mem=$(( per_mem * nodes ))
numa=()
for ((i = 0; i < nodes; i++)); do
  first=$(( i * per_node )); last=$(( first + per_node - 1 ))
  numa+=(-object "memory-backend-ram,id=ram$i,size=${per_mem}M" -numa "node,nodeid=$i,cpus=$first-$last,memdev=ram$i")
done
smp=$(( nodes * per_node ))

cmdline="console=ttyS0 rdinit=/init panic=-1 quiet loglevel=3 numa_balancing=disable mitigations=off"
cmdline+=" tsc=reliable no_timer_check lpj=10000000 audit=0 apparmor=0 security=none cryptomgr.notests 8250.nr_uarts=1"
log=$work/console.log
set +e
timeout --foreground -k 5 "$timeout" qemu-system-x86_64 \
  -nodefaults -no-user-config -nographic -no-reboot -machine pc -accel tcg,thread=multi -cpu qemu64 \
  ${bios:+-bios "$bios"} -smp "$smp,sockets=$nodes,cores=$per_node,threads=1" -m "${mem}M" "${numa[@]}" \
  -kernel "$vmlinux" -initrd "$work/initramfs.cpio" -append "$cmdline" \
  -serial stdio -monitor none -net none < /dev/null | tr -d '\r' | tee "$log"
qemu_status=${PIPESTATUS[0]}
set -e
status=$(sed -n 's/^STRATA_VM_STATUS=\([0-9]*\).*/\1/p' "$log" | tail -1)
if [[ -z $status ]]; then
  echo "strata-vm.sh: the VM gave no result (qemu status $qemu_status$([[ $qemu_status == 124 ]] && echo ", timed out after ${timeout} s"))" >&2
  exit 125
fi
exit "$status"
