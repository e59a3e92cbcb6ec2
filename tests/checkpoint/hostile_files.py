"""Writes crafted checkpoint files that each carry one hostile structure, for the tests
of issue 49: files of a few KB that made troupe-ckpt verify crash, hang or allocate GBs.

    hostile_files.py OUTDIR [--step N]

Every file is otherwise a whole troupe checkpoint (format 2.0 root attributes with
fixed-length strings, the complete marker, a /model section holding one valid empty
tensor), so a reader gets past its first checks and reaches the hostile part. plain.h5
is the same file with nothing hostile: it must verify. Prints one line per file:
"NAME KEYWORD", KEYWORD being a word the reader's refusal must contain."""
import argparse
import os

import h5py
import numpy

# XXH64 (seed 0) of no bytes: the checksum of an empty tensor.
XXH64_OF_NOTHING = 0xEF46DB3751D8E999


def text(s):
    """A fixed-length string attribute value, as troupe writes them (not h5py's vlen str)."""
    return numpy.bytes_(s.encode())


def checkpoint(path, step, libver="latest"):
    """A valid format 2 checkpoint with an empty f32 tensor /model/w; returns it open."""
    f = h5py.File(path, "w", libver=libver)
    f.attrs.create("format", text("troupe-checkpoint"))
    f.attrs.create("format_version", text("2.0"))
    for name, value in (("step", step), ("epoch", 0), ("world_size", 1)):
        f.attrs.create(name, numpy.int64(value))
    for name, value in (("created_utc", "2026-01-01T00:00:00Z"), ("run_id", "hostile"), ("config", "{}")):
        f.attrs.create(name, text(value))
    f.attrs.create("complete", numpy.int64(1))
    tensor(f, "model/w", (0,))
    return f


def tensor(f, name, shape, **options):
    """An f32 dataset with troupe's dtype and xxh64 attributes; no data is written."""
    d = f.create_dataset(name, shape=shape, dtype="<f4", **options)
    d.attrs.create("dtype", text("f32"))
    d.attrs.create("xxh64", numpy.uint64(XXH64_OF_NOTHING))
    return d


def link_cycle(f):
    f["model/loop"] = f["/"]  # a hard link from /model back to the root: /model/loop/model/loop/...


def huge_declared(f):
    tensor(f, "model/huge", (2**31,))  # 8.6 GB declared, no byte stored


def overflow(f):
    tensor(f, "model/overflow", (2**32, 2**32))  # 2^64 elements: the count wraps to 0


def external_link(f):
    f["model/elink"] = h5py.ExternalLink("hostile.fifo", "/w")  # opening a FIFO blocks


def external_storage(f):
    # The raw data lives in another file, again the FIFO: reading it would block.
    tensor(f, "model/external", (4,), external=[("hostile.fifo", 0, 16)])


def soft_link(f):
    f["model/soft"] = h5py.SoftLink("/model/w")


def control_name(f):
    # A soft link (refused) whose name would break a message into lines and recolour
    # the terminal if printed as it is.
    f["model"]["bad\nname\x1b[31m"] = h5py.SoftLink("/model/w")


def rank_33(path, step):
    """HDF5's API refuses a rank above 32, so a rank-32 dataspace is written and its rank
    byte raised to 33 in the file (format 0 object headers carry no checksum)."""
    with checkpoint(path, step, libver="earliest") as f:
        tensor(f, "model/rank33", (1,) * 32)
    data = bytearray(open(path, "rb").read())
    # Dataspace message version 1: version, rank, flags, reserved, 4 reserved, then the dims.
    dims = (1).to_bytes(8, "little") * 32
    at = -1
    for flags in (0, 1):
        at = data.find(bytes([1, 32, flags, 0, 0, 0, 0, 0]) + dims)
        if at >= 0:
            break
    if at < 0:
        return False
    data[at + 1] = 33
    open(path, "wb").write(data)
    return True


CASES = [  # name, what to add, a word the refusal must contain
    ("link_cycle", link_cycle, "cycle"),
    ("huge_declared", huge_declared, "2147483648"),
    ("overflow", overflow, "overflow"),
    ("external_link", external_link, "external link"),
    ("external_storage", external_storage, "external"),
    ("soft_link", soft_link, "soft link"),
    ("control_name", control_name, "bad\\x0aname\\x1b[31m"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--step", type=int, default=2)
    args = parser.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    fifo = os.path.join(args.outdir, "hostile.fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    checkpoint(os.path.join(args.outdir, "plain.h5"), args.step).close()
    print("plain.h5 ok")
    for name, add, keyword in CASES:
        path = os.path.join(args.outdir, name + ".h5")
        with checkpoint(path, args.step) as f:
            add(f)
        print(name + ".h5", keyword)
    if rank_33(os.path.join(args.outdir, "rank_33.h5"), args.step):
        print("rank_33.h5", "dataspace")


if __name__ == "__main__":
    main()
