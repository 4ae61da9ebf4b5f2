"""A real Megatron-Core save's args changed in place, as a job launched with another flag would have
saved them: one pickle byte of common.pt's data.pkl, its CRC-32 fixed in the local header and the
central directory, so the file stays a valid zip that ucp reads as any other."""
import struct
import zipfile
import zlib


def set_flag_in_args(common_pt, flag):
    """common.pt with args.<flag> False made True (NEWFALSE -> NEWTRUE)."""
    raw = bytearray(open(common_pt, "rb").read())
    info = next(i for i in zipfile.ZipFile(common_pt).infolist() if i.filename.endswith("data.pkl"))
    n, e = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + n + e
    key = raw.index(flag.encode(), start, start + info.file_size)
    value = raw.index(b"\x89", key + len(flag), key + len(flag) + 4)  # after the key (and its MEMOIZE)
    raw[value] = 0x88
    crc = struct.pack("<I", zlib.crc32(bytes(raw[start:start + info.file_size])) & 0xFFFFFFFF)
    raw[info.header_offset + 14:info.header_offset + 18] = crc
    central = raw.index(b"PK\x01\x02" + bytes(raw[info.header_offset + 4:info.header_offset + 6]), start + info.file_size)
    while not raw[central + 46:central + 46 + len(info.filename)] == info.filename.encode():
        central = raw.index(b"PK\x01\x02", central + 4)
    raw[central + 16:central + 20] = crc
    open(common_pt, "wb").write(bytes(raw))
