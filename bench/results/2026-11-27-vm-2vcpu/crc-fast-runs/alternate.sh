#!/bin/bash
# alternate the crc32c build and the crc-fast build: bench stripe --checksums on tmpfs
out=${OUT:-/tmp/crcrun}; mkdir -p $out
for i in $(seq 1 ${N:-3}); do
  for b in before after; do
    bin=/tmp/penstock-$b
    echo "== $b $i $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> $out/log
    $bin bench stripe --checksums --dir /dev/shm --size ${SIZE:-256MiB} --reps ${REPS:-5} --json $out/$b-$i.json >> $out/log 2>&1
  done
done
echo ALLDONE >> $out/log
