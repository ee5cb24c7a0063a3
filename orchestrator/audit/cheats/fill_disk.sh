# Fill the disk: write until refused (or 512 MiB) in the workdir, /tmp, /dev/shm and $HOME (a policy that
# learns to write files must meet ENOSPC at the sandbox's bound, scored as any failure, never
# env_failure, and leave the host and the other rollouts running).
for d in . /tmp /dev/shm "$HOME"; do
  dd if=/dev/zero of="$d/envhub-fill.bin" bs=1048576 count=512 2>/dev/null
done
exit 0
