"""Rewrites a troupe checkpoint the way format 1.x stored it: every string attribute
variable-length (h5py's default for str) and format_version "1.0", or the version given.

    as_format1.py FILE [VERSION]"""
import sys

import h5py

path = sys.argv[1]
version = sys.argv[2] if len(sys.argv) > 2 else "1.0"
with h5py.File(path, "r+") as f:
    objects = [f]
    f.visititems(lambda name, obj: objects.append(obj))
    for obj in objects:
        for name in list(obj.attrs):
            value = obj.attrs[name]
            if isinstance(value, bytes):
                del obj.attrs[name]
                obj.attrs[name] = value.decode()
    del f.attrs["format_version"]
    f.attrs["format_version"] = version
