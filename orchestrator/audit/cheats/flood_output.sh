# Flood the output: 50 MB on stdout, 20 MB on stderr, more through the parent's descriptor
# (/proc/$PPID/fd/1), a 100 MB file, a 4 GiB sparse file and 2000 files in the workdir.
head -c 50000000 /dev/zero | tr '\0' A
head -c 20000000 /dev/zero | tr '\0' B >&2
[ -w "/proc/$PPID/fd/1" ] && head -c 20000000 /dev/zero | tr '\0' C > "/proc/$PPID/fd/1" 2>/dev/null
head -c 100000000 /dev/zero > flood.bin 2>/dev/null
truncate -s 4G sparse.bin 2>/dev/null || dd if=/dev/zero of=sparse.bin bs=1 count=0 seek=4G 2>/dev/null
mkdir -p flood 2>/dev/null
i=0; while [ $i -lt 2000 ]; do : > "flood/f$i.txt" 2>/dev/null; i=$((i+1)); done
exit 0
