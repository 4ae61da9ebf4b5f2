"""What the trust tests do to files and folders: flip one byte inside a zip record's payload (a
tensor's bytes in a torch.save file), and a digest of a whole folder to show it was left as it was."""
import hashlib
import os
import zipfile


def record_offset(path, name_part):
    """The middle byte of the first zip record's payload (over 64 bytes) whose name holds `name_part`
    (the record of that very name, where there is one), and that record's name."""
    with zipfile.ZipFile(path) as z:
        infos = [i for i in z.infolist() if name_part in i.filename and i.file_size > 64]
        info = next((i for i in infos if i.filename == name_part), infos[0] if infos else None)
        if info is None:
            raise ValueError(f"{path}: no record of over 64 bytes named like {name_part!r}")
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    return info.header_offset + 30 + n + m + info.file_size // 2, info.filename


def flip(path, offset):
    """Flips one bit of the byte at `offset`."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def flip_in_record(path, name_part="/data/"):
    """Flips a byte in the middle of a tensor record of a torch.save file; returns the record's name."""
    offset, record = record_offset(path, name_part)
    flip(path, offset)
    return record


def first_tensor(value, keys):
    """The first tensor anywhere in a torch.load'ed value under one of `keys`: the value itself, or the
    first of a list of them (a list of flat groups)."""
    import torch
    if isinstance(value, dict):
        for k, v in value.items():
            if k in keys and torch.is_tensor(v):
                return v
            if k in keys and isinstance(v, (list, tuple)) and v and torch.is_tensor(v[0]):
                return v[0]
            found = first_tensor(v, keys)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for v in value:
            found = first_tensor(v, keys)
            if found is not None:
                return found
    return None


def records_holding(path, tensor):
    """The zip records of a torch.save file whose bytes are exactly `tensor`'s."""
    import torch
    want = tensor.contiguous().view(torch.uint8).numpy().tobytes()
    with zipfile.ZipFile(path) as z:
        return [i.filename for i in z.infolist() if i.file_size == len(want) and z.read(i) == want]


def tree_digest(d):
    """SHA-256 over the names and bytes of every file under `d`, in order."""
    h = hashlib.sha256()
    for dp, dns, fns in sorted(os.walk(d)):
        dns.sort()
        for f in sorted(fns):
            h.update(f.encode() + open(os.path.join(dp, f), "rb").read())
    return h.hexdigest()
