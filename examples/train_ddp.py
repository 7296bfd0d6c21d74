"""examples/train.py under DistributedDataParallel.

    torchrun --standalone --nproc-per-node=8 examples/train_ddp.py     # one process per GPU (NCCL)
    torchrun --standalone --nproc-per-node=2 examples/train_ddp.py --device cpu --steps 40   # CPU, gloo

What changes for gpuaccel under DDP:
- PinnedLoader reads torch.distributed's rank and world size: each rank gets a
  disjoint, equal-length shard of every (reshuffled) epoch.
- LossLogger(reduce="mean") averages each window over the ranks with an
  asynchronous all-reduce, so the logged loss is the global one and no rank
  ever waits on .item().  Rank 0 prints.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gpuaccel as ga
from gpuaccel import dataset
from gpuaccel._cli import check_device

from train import make_model

USAGE = ("run it with torchrun, one process per device: torchrun --standalone --nproc-per-node=2 "
         "examples/train_ddp.py --device cpu --steps 40 (or --nproc-per-node=<GPUs> on a GPU machine)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " " + USAGE[0].upper() + USAGE[1:] + ".")
    parser.add_argument("--device", default=None, choices=("cuda", "cpu"),
                        help="cuda (NCCL, one GPU per process: LOCAL_RANK) or cpu (gloo) (default: cuda when usable)")
    parser.add_argument("--steps", type=int, default=600, help="training steps (default: 600)")
    parser.add_argument("--batch-size", type=int, default=128, help="images per step on each rank (default: 128)")
    parser.add_argument("--samples", type=int, default=20000,
                        help="training images to generate (default: 20000; held-out: a fifth, at least 1000)")
    parser.add_argument("--data", default=dataset.default_folder(),
                        help="where generated sets are kept (default: %(default)s)")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:  # torchrun sets them for each process
        print("examples/train_ddp.py: %s" % USAGE, file=sys.stderr)
        return 2
    args.device = args.device or ("cuda" if ga.cuda_available() and torch.cuda.is_available() else "cpu")
    if check_device(torch, args.device) is None:
        return 2
    on_gpu = args.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)

    # one rank generates the data set, the others wait for it
    if rank == 0:
        files = dataset.ensure(args.data, args.samples, max(1000, args.samples // 5))
    dist.barrier()
    files = dataset.ensure(args.data, args.samples, max(1000, args.samples // 5))
    mean, std = dataset.mean_std()
    dtype = "bfloat16" if on_gpu else "float32"
    layout = "NHWC" if on_gpu else "NCHW"  # NHWC: channels_last batches for the channels_last model

    torch.manual_seed(0)  # the same initial weights on every rank
    model = make_model().to(device)
    if on_gpu:
        model = model.to(memory_format=torch.channels_last)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if on_gpu else None)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = ga.PinnedLoader([files["train_x"], files["train_y"]], args.batch_size, shuffle=True, drop_last=True,
                             device=str(device), transform=ga.ImageNormalize(mean, std, dtype=dtype, layout=layout))
    on_log = (lambda step, v: print("step %5d  loss %.4f (mean of %d ranks)" % (step, v["loss"], world))) \
        if rank == 0 else None
    log = ga.LossLogger(every=20, reduce="mean", on_log=on_log)

    step = 0
    while step < args.steps:
        for images, labels in loader:  # this rank's shard
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
                loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            log.log(loss=loss.detach())
            step += 1
            if step == args.steps:
                break
    log.close()
    final = log.latest().get("loss")
    if rank == 0:
        print("final loss %.4f on %d ranks" % (final, world))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
