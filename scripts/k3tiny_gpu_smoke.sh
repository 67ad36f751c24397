#!/bin/bash
# GPU smoke test of python/k3tiny/train.py on fake data (vocab 8192): speed, memory, export.
set -e
python3 -c "import torch,sys; print(sys.version, torch.__version__, torch.cuda.get_device_name())"
python3 -c "
import sys; sys.path.insert(0,'python')
from k3tiny.train import write_fake_data
write_fake_data('/tmp/fake', vocab=8192, n_train=4000000, n_val=200000, seed=0)"
python3 python/k3tiny/train.py --data /tmp/fake --out ${OUT:-/tmp}/run --minutes ${MIN:-1.5} --eval-every 100 --eval-batches 4 "$@"
ls -la ${OUT:-/tmp}/run ${OUT:-/tmp}/run/hf
