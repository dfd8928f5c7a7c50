#!/bin/bash
# The second run of the lease: the automatic read budget's floor raised with the decode threads
# (one batch per two threads beyond four). The scaling part at 16 threads, the read path alone
# with its automatic budget against a fixed 256 MiB, then, if time is left, torchvision's augmented
# reference script on 6,000 images (its collate_fn in forked processes), one pair.
set -o pipefail
export PYTHONUNBUFFERED=1
D=build/device-check
REPO=$PWD
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
CORES=$(nproc)
PY=${PY:-python3}
BUDGET=${BUDGET:-265}

$PY -m bench.device_check --out $D --data build/device-check-data --carry .device --parts scaling \
    --threads ${THREADS:-$CORES} ${DRY:+--dry-run} 2>&1 | tee $OUT/device-check.log
rc=$?
cp $D/device-check.json $OUT/device-check-run2.json 2>/dev/null
cp $D/device-check.md $OUT/device-check-run2.md 2>/dev/null
echo "device check rc=$rc after $(el) s"
export PYTHONPATH=$REPO:$REPO/$D/site
{
  echo "== read_handout, $(el) s"
  timeout 60 $PY -m bench.read_handout build/device-check-data/packed build/device-check-data/packed-restart \
      --queue-depth $CORES --consumers $CORES --variants auto,budget256 --repeats 2 ${DRY:+--batches 5 --repeats 1}
  echo "read_handout rc=$? after $(el) s"
} 2>&1 | tee $OUT/read_handout-run2.txt
left=$(( BUDGET - $(el) ))
{
  echo "== torchvision-reference-augmented, 6000 images, $CORES workers, ${left} s left"
  if [ $left -gt 110 ]; then
    timeout $left $PY -m bench.clients --data $REPO/build/clients-data-6000 --count ${COUNT:-6000} --rounds 1 \
        --workers $CORES --only torchvision-reference-augmented --json $OUT/clients-6000.json ${DRY:+--quick}
    echo "clients rc=$? after $(el) s"
  else
    echo "skipped: no time left"
  fi
} 2>&1 | tee $OUT/clients-run2.txt
exit $rc
