#!/bin/bash
# One lease on a GPU machine: the full device check, then fastload against torch's DataLoader on
# every core (pytorch/examples pipeline) and three torch clients through their own scripts.
set -o pipefail
export PYTHONUNBUFFERED=1
D=build/device-check
mkdir -p $OUT/dropin16
start=$(date +%s)
(if command -v make >/dev/null; then make device-check DEVICE_CHECK_OUT=$D; else python3 -m bench.device_check --out $D; fi) 2>&1 | tee $OUT/device-check.log
rc=$?
cp $D/device-check.json $D/device-check.md $OUT/ 2>/dev/null
echo "device check rc=$rc after $(( $(date +%s) - start )) s"
export PYTHONPATH=$PWD:$PWD/$D/site
CORES=$(nproc)
{
  echo "== torch_dropin, $CORES workers, $(date -u +%H:%M:%S)"
  timeout 100 python3 -m bench.torch_dropin build/device-check-data/images --workers $CORES --rounds 3 --out $OUT/dropin16
  echo "torch_dropin rc=$? after $(( $(date +%s) - start )) s"
  left=$(( 545 - ($(date +%s) - start) ))
  echo "== clients, $CORES workers, ${left} s left, $(date -u +%H:%M:%S)"
  if [ $left -gt 60 ]; then
    timeout $left python3 -m bench.clients --data build/clients-data --count 2000 --rounds 2 --workers $CORES \
      --only pytorch-examples-imagenet,torchvision-reference-augmented,timm --json $OUT/clients16.json
    echo "clients rc=$? after $(( $(date +%s) - start )) s"
  fi
} 2>&1 | tee $OUT/extras.log
tar czf $OUT/logs.tar.gz $D/*.log 2>/dev/null
exit $rc
