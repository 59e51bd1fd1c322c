#!/usr/bin/env python3
"""cue.py: Cues' cue() from Python, through libpenstock's C API with ctypes.

    python3 examples/python/cue.py FILE HOST PORT     # stream FILE to a TCP receiver
    python3 examples/python/cue.py --check            # a self-contained, byte-exact demo

The library is found as PENSTOCK_LIB (a path to libpenstock.so), else as "libpenstock.so"
through the dynamic linker (after `cargo cinstall`, with the install's lib directory known to
ld.so or in LD_LIBRARY_PATH).

penstock_cue() returns a control descriptor: an ordinary file descriptor, written with
os.write and read with os.read; each command line gets one reply line ("200 started").
The file and the socket are handed over as fd:N; penstock duplicates them, so Python may
close its own at once.
"""
import ctypes
import ctypes.util
import os
import socket
import sys
import tempfile
import threading


def load():
    if "PENSTOCK_LIB" in os.environ:
        names = [os.environ["PENSTOCK_LIB"]]
    else:
        names = [n for n in ("libpenstock.so", ctypes.util.find_library("penstock")) if n]
    last = None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            last = e
    else:
        sys.exit(f"libpenstock not found ({last}); set PENSTOCK_LIB=/path/to/libpenstock.so")
    lib.penstock_engine_new.restype = ctypes.c_void_p
    lib.penstock_engine_new.argtypes = [ctypes.c_void_p]
    lib.penstock_engine_drain.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.penstock_engine_free.argtypes = [ctypes.c_void_p]
    lib.penstock_cue.restype = ctypes.c_int
    lib.penstock_cue.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.penstock_last_error.restype = ctypes.c_char_p
    return lib


def command(ctl, line):
    """Sends one command line, returns its reply (the last line of a multi-line one)."""
    os.write(ctl, line.encode() + b"\n")
    reply = b""
    while True:
        b = os.read(ctl, 1)
        if not b:
            raise RuntimeError(f"{line}: the control descriptor closed")
        if b == b"\n":
            text = reply.decode()
            if len(text) >= 4 and text[3] == "-":  # a continuation line of STATE, HELP
                reply = b""
                continue
            return text
        reply += b


def cue(lib, engine, src, dst, options=""):
    ctl = lib.penstock_cue(engine, src.encode(), dst.encode(), options.encode())
    if ctl < 0:
        raise RuntimeError(f"penstock_cue: {lib.penstock_last_error().decode()} ({ctl})")
    return ctl


def stream_file(path, host, port):
    lib = load()
    engine = lib.penstock_engine_new(None)
    if not engine:
        sys.exit(f"penstock_engine_new: {lib.penstock_last_error().decode()}")
    with open(path, "rb") as f, socket.create_connection((host, port)) as s:
        ctl = cue(lib, engine, f"fd:{f.fileno()}", f"fd:{s.fileno()}")
    # Python's own copies are closed: penstock holds its duplicates.
    print(command(ctl, "START"))
    lib.penstock_engine_drain(engine, -1)
    print(command(ctl, "STATE"))
    os.close(ctl)
    lib.penstock_engine_free(engine)


def check():
    """Streams a file of known bytes to a local receiver and compares: prints 'byte-exact'."""
    lib = load()
    engine = lib.penstock_engine_new(None)
    if not engine:
        sys.exit(f"penstock_engine_new: {lib.penstock_last_error().decode()}")
    data = bytes((i * 7 + i // 4099) % 256 for i in range(1 << 20))
    with tempfile.NamedTemporaryFile() as tmp:
        tmp.write(data)
        tmp.flush()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        got = bytearray()

        def receive():
            conn, _ = listener.accept()
            with conn:
                while chunk := conn.recv(1 << 16):
                    got.extend(chunk)

        receiver = threading.Thread(target=receive)
        receiver.start()
        port = listener.getsockname()[1]
        # A window of the file: SEEK and LENGTH before START.
        ctl = cue(lib, engine, tmp.name, f"tcp://127.0.0.1:{port}")
        for line in ("SEEK 4096", "LENGTH 500000", "START"):
            reply = command(ctl, line)
            assert reply.startswith("200"), f"{line}: {reply}"
        receiver.join()
        state = command(ctl, "STATE")
        os.close(ctl)
        listener.close()
    lib.penstock_engine_free(engine)
    assert bytes(got) == data[4096:4096 + 500000], f"{len(got)} bytes differ"
    print(f"{len(got)} bytes, byte-exact ({state})")


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        check()
    elif len(sys.argv) == 4:
        stream_file(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
