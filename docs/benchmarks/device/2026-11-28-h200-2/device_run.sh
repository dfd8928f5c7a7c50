#!/bin/bash
# One lease on a GPU machine, after the read hand-out fix (9da4091): the engine build, the data and the
# scaling part of the device check at 8 and 16 threads (Loader against the engine alone), the read
# path's hand-out rate, then torchvision's reference script with its MixUp/CutMix collate_fn at every
# core, with fastload as on main and with the collate_fn in forked processes (a patch carried in
# .device/), alternated.
set -o pipefail
export PYTHONUNBUFFERED=1
D=build/device-check
REPO=$PWD
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
CORES=$(nproc)
THREADS=${THREADS:-8,$CORES}
COUNT=${COUNT:-2000}
PY=${PY:-python3}

$PY -m bench.device_check --out $D --data build/device-check-data --carry .device --parts scaling \
    --threads $THREADS ${DRY:+--dry-run} 2>&1 | tee $OUT/device-check.log
rc=$?
cp $D/device-check.json $D/device-check.md $OUT/ 2>/dev/null
echo "device check rc=$rc after $(el) s"
export PYTHONPATH=$REPO:$REPO/$D/site

{
  echo "== read_handout, $(el) s"
  timeout 150 $PY -m bench.read_handout build/device-check-data/packed build/device-check-data/packed-restart \
      --queue-depth $CORES --consumers $CORES ${DRY:+--batches 5 --repeats 1}
  echo "read_handout rc=$? after $(el) s"
} 2>&1 | tee $OUT/read_handout.log

# The collate-process variant: the same tree with the patch applied (the engine as built above).
TV=/tmp/fastload-collate-procs
rm -rf $TV && mkdir -p $TV
tar --exclude=./build --exclude=./.device -cf - . | tar -xf - -C $TV
(cd $TV && patch -p1 -s < $REPO/.device/collate_procs.patch) || { echo "patch failed"; exit 1; }
{
  for round in 1 2; do
    for tree in main collate-procs; do
      left=$(( ${BUDGET:-540} - $(el) ))
      echo "== torchvision-reference-augmented, $tree, round $round, $CORES workers, ${left} s left"
      if [ $left -lt 50 ]; then echo "skipped: no time left"; continue; fi
      dir=$REPO; [ $tree = collate-procs ] && dir=$TV
      (cd $dir && PYTHONPATH=$dir:$REPO/$D/site timeout $left $PY -m bench.clients --data $REPO/build/clients-data \
          --count $COUNT --rounds 1 --workers $CORES --only torchvision-reference-augmented \
          --json $OUT/clients-$tree-$round.json ${DRY:+--quick})
      echo "clients rc=$? after $(el) s"
    done
  done
} 2>&1 | tee $OUT/clients.log
exit $rc
