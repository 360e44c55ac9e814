#!/usr/bin/python3
"""Seed corpora for the fuzz targets (fuzz/): real files of every kind each parser reads.

    scripts/fuzz_seeds.py OUT_DIR

writes OUT_DIR/<target>/<name> for the targets whose seeds come from Python: JPEG variants made
by Pillow (libjpeg-turbo: baseline 4:2:0, 4:2:2, 4:4:4, grayscale, CMYK, progressive, optimized
tables, several sizes), a PNG and a BMP (the OpenCV fallback); pickles from Python's pickle
(protocols 2 to 5) and the data.pkl of files torch.save wrote (Debian's python3-torch); torch.save
archives of state dicts, an optimizer's state and a training checkpoint; aiacc's named-tensor
format; checkpoint folders (`latest`, a manifest with its CRC-32C, the payload); the shipped
recipes and flagfile lines; and the variables of each launcher. The seeds aiacc encodes itself
(its checkpoints and training states) are written by the targets (AIACC_FUZZ_WRITE_SEEDS,
scripts/fuzz.sh). Small files only: each is one fuzz input.
"""
import collections
import io
import os
import pickle
import struct
import sys
import zipfile

from PIL import Image

out = sys.argv[1]


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- Images: the data path (fuzz_jpeg, fuzz_jpeg_index).
def picture(w, h, mode="RGB"):
    im = Image.new("RGB", (w, h))
    px = im.load()
    for y in range(h):
        for x in range(w):
            px[x, y] = ((x * 255) // max(1, w - 1), (y * 255) // max(1, h - 1), ((x // 5 + y // 3) % 3) * 100)
    return im.convert(mode) if mode != "RGB" else im


def jpeg(im, **kw):
    b = io.BytesIO()
    im.save(b, "JPEG", **kw)
    return b.getvalue()


for w, h in [(8, 8), (17, 13), (48, 32), (64, 64)]:
    rgb = picture(w, h)
    for sub, name in [(2, "420"), (1, "422"), (0, "444")]:
        for jpg in ("jpeg", "jpeg_index"):
            put("fuzz_" + jpg, f"{name}_{w}x{h}.jpg", jpeg(rgb, quality=85, subsampling=sub))
    put("fuzz_jpeg", f"gray_{w}x{h}.jpg", jpeg(picture(w, h, "L"), quality=90))
    put("fuzz_jpeg", f"cmyk_{w}x{h}.jpg", jpeg(picture(w, h, "CMYK"), quality=90))
    put("fuzz_jpeg", f"progressive_{w}x{h}.jpg", jpeg(rgb, quality=80, progressive=True))
    put("fuzz_jpeg_index", f"optimized_{w}x{h}.jpg", jpeg(rgb, quality=75, optimize=True))
    put("fuzz_jpeg", f"q100_{w}x{h}.jpg", jpeg(rgb, quality=100, subsampling=0))
for fmt in ("PNG", "BMP"):
    b = io.BytesIO()
    picture(20, 12).save(b, fmt)
    put("fuzz_jpeg", "image." + fmt.lower(), b.getvalue())


# ---- Pickles (fuzz_pickle) and torch.save archives (fuzz_torch_save).
values = {
    "a": -3, "b": 2.5, "c": [1, None, True, False], "d": (1, "x"), "big": 2**40, "neg": -(2**70),
    "nested": {"x": [{"y": (1, 2, [3])}]}, "bytes": b"\x00\x01", "s": "long" * 20,
}
shared = [1, 2]
values["shared"] = (shared, shared)
for proto in (2, 3, 4, 5):
    put("fuzz_pickle", f"values_p{proto}.pkl", pickle.dumps(values, protocol=proto))
    put("fuzz_pickle", f"ordered_p{proto}.pkl",
        pickle.dumps(collections.OrderedDict([("z", 1), ("a", (2, 3, 4))]), protocol=proto))

try:
    import torch

    lin = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin(torch.randn(4, 3)).sum().backward()
    opt.step()
    x = torch.arange(6.0)
    saved = {
        "state_dict.pt": lin.state_dict(),
        "plain_dict.pt": dict(lin.state_dict()),
        "views.pt": {"x": x, "mid": x[1:3], "t": x.view(2, 3).t()},
        "optimizer.pt": opt.state_dict(),
        "checkpoint.pt": {"state_dict": lin.state_dict(), "epoch": 3, "best": 0.5},
        "ddp.pt": {"module." + k: v for k, v in lin.state_dict().items()},
        "dtypes.pt": {"h": x.half(), "bf": x.bfloat16(), "i": x.int(), "b": x > 2, "l": x.long()},
    }
    for name, value in saved.items():
        b = io.BytesIO()
        torch.save(value, b)
        put("fuzz_torch_save", name, b.getvalue())
        put("fuzz_checkpoint", name, b.getvalue())
        with zipfile.ZipFile(io.BytesIO(b.getvalue())) as z:
            pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
            put("fuzz_pickle", name.replace(".pt", ".data.pkl"), z.read(pkl))
except ImportError:
    print("fuzz_seeds.py: no torch module: the torch.save seeds are left out", file=sys.stderr)

# aiacc's named-tensor format (models/weights.h): magic, count, then name, dtype, shape, data.
w = b"AIACCW01" + struct.pack("<Q", 2)
w += struct.pack("<I", 9) + b"fc.weight" + struct.pack("<II", 0, 2) + struct.pack("<qq", 2, 3)
w += struct.pack("<6f", *range(6))
w += struct.pack("<I", 7) + b"counter" + struct.pack("<II", 1, 1) + struct.pack("<q", 1) + struct.pack("<q", 5)
put("fuzz_torch_save", "weights.aiaccw", w)


# ---- Checkpoint folders (fuzz_checkpoint_dir): latest NUL manifest NUL payload.
def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


name = "step-000000000007.ckpt"
for payload in (b"", b"payload bytes\n", bytes(range(256))):
    manifest = (f"aiacc-checkpoint-manifest 1\nstep 7\npayload {name}\nsize {len(payload)}\n"
                f"crc32c {crc32c(payload):08x}\n").encode()
    put("fuzz_checkpoint_dir", f"valid_{len(payload)}", f"{name}\n".encode() + b"\0" + manifest + b"\0" + payload)
put("fuzz_checkpoint_dir", "no_latest", b"\0" + manifest + b"\0" + payload)

# ---- Recipes and flagfiles (fuzz_recipe, fuzz_flagfile).
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
for r in sorted(os.listdir(os.path.join(root, "recipes"))):
    with open(os.path.join(root, "recipes", r), "rb") as f:
        put("fuzz_recipe", r, f.read())
put("fuzz_recipe", "keys.recipe", b"arch = resnet18\nlr = 0.5 # comment\nstage 0 size=96 batch=64 scale=0.35\n"
    b"stage 4 size=128\nbucket-mb = 8\nallreduce-dtype = fp16\nelastic-batch = keep-global\n")
put("fuzz_flagfile", "flags", b"--arch=resnet18\n--lr=0.2\n--epochs=3\n--resize_schedule=0:128,2:160\n"
    b"--lr_step_epochs=1,2\n--checkpoint_every=10m\n--checkpoint_dir=/tmp/x\n--amp\n--amp_dtype=bf16\n")
put("fuzz_flagfile", "dist", b"--nproc=2\n--bucket_mb=16\n--streams=2\n--bn_sync=average\n--hierarchical=on\n"
    b"--nnodes=1:3\n--comm_timeout=30\n")

# ---- Launcher environments (fuzz_launch_env).
envs = {
    "torchrun": "RANK=1\nWORLD_SIZE=4\nLOCAL_RANK=1\nLOCAL_WORLD_SIZE=2\nGROUP_RANK=0\nMASTER_ADDR=127.0.0.1\n"
                "MASTER_PORT=29500\nTORCHELASTIC_RUN_ID=abc\nTORCHELASTIC_RESTART_COUNT=0\n",
    "slurm": "SLURM_JOB_ID=42\nSLURM_STEP_ID=0\nSLURM_PROCID=3\nSLURM_STEP_NUM_TASKS=4\nSLURM_LOCALID=1\n"
             "SLURM_NODEID=1\nSLURM_STEP_TASKS_PER_NODE=2(x2)\nSLURM_STEP_NUM_NODES=2\n"
             "SLURM_STEP_NODELIST=node[01-02]\n",
    "openmpi": "OMPI_COMM_WORLD_RANK=1\nOMPI_COMM_WORLD_SIZE=2\nOMPI_COMM_WORLD_LOCAL_RANK=1\n"
               "OMPI_COMM_WORLD_LOCAL_SIZE=2\n",
    "mpich": "PMI_RANK=0\nPMI_SIZE=2\nMPI_LOCALRANKID=0\nMPI_LOCALNRANKS=2\n",
    "horovod": "HOROVOD_RANK=0\nHOROVOD_SIZE=2\nHOROVOD_LOCAL_RANK=0\nHOROVOD_LOCAL_SIZE=2\n"
               "HOROVOD_CROSS_RANK=0\nHOROVOD_CROSS_SIZE=1\nHOROVOD_GLOO_RENDEZVOUS_ADDR=10.0.0.1\n",
    "kubeflow": "PET_NNODES=1:3\nPET_NPROC_PER_NODE=2\nPET_NODE_RANK=0\nPET_MASTER_ADDR=host\n"
                "PET_MASTER_PORT=23456\n",
    "aiacc": "AIACC_RANK=1\nAIACC_WORLD_SIZE=2\nAIACC_LOCAL_RANK=1\nAIACC_LOCAL_SIZE=2\n"
             "AIACC_MASTER=127.0.0.1:29400\nAIACC_ELASTIC_MIN_NODES=1\n",
}
for name, text in envs.items():
    put("fuzz_launch_env", name, text.encode())
