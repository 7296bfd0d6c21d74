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

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gpuaccel as ga
from gpuaccel import dataset

from train import make_model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if ga.cuda_available() else "cpu")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=128, help="per rank")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--data", default=os.path.join(os.path.expanduser("~"), ".cache", "gpuaccel", "data"))
    args = parser.parse_args(argv)
    on_gpu = args.device.startswith("cuda")
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
    return final


if __name__ == "__main__":
    main()
