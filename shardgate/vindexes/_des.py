"""Bulk single DES-ECB with the null key, from OpenSSL's legacy provider, when it is there.

``cryptography`` offers DES only as 3DES, which with three equal keys is the
same function at three times the work. For the batches of the Spark sources
(hundreds of thousands of values per call) single DES is worth having:
OpenSSL 3 keeps it in its *legacy* provider, which Debian, Ubuntu and Fedora
ship with ``libcrypto.so.3``. This module reaches it through ``ctypes`` in a
library context of its own (so the process-wide default context, which libpq
and others use, is left as it is) and checks it against 3DES once.

:func:`bulk_des` returns None when there is no such library or provider;
callers then use 3DES. One ``EVP_CIPHER_CTX`` per thread: an OpenSSL context
must not be driven by two threads at once. ctypes releases the GIL during the
call, so two tasks in threads hash in parallel.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
from functools import lru_cache

#: bytes per EVP call (its length argument is a C int)
_CHUNK = 1 << 28


class _Context:
    """One thread's ``EVP_CIPHER_CTX``, freed with this object."""

    def __init__(self, lib: ctypes.CDLL, cipher: int) -> None:
        self.lib = lib
        self.ptr = lib.EVP_CIPHER_CTX_new()
        if not self.ptr or lib.EVP_EncryptInit_ex(self.ptr, cipher, None, bytes(8), None) != 1:
            raise OSError("EVP_EncryptInit_ex failed")
        lib.EVP_CIPHER_CTX_set_padding(self.ptr, 0)

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            self.lib.EVP_CIPHER_CTX_free(self.ptr)

    def encrypt(self, plain: bytes) -> bytes:
        out = bytearray(plain)
        self.encrypt_inplace(out)
        return bytes(out)

    def encrypt_inplace(self, buf: bytearray | memoryview) -> None:
        """Encrypt a writable buffer of whole blocks in place (OpenSSL allows in == out)."""
        view = memoryview(buf).cast("B")
        written = ctypes.c_int()
        for off in range(0, len(view), _CHUNK):
            n = min(_CHUNK, len(view) - off)
            ptr = ctypes.addressof((ctypes.c_char * n).from_buffer(view, off))
            ok = self.lib.EVP_EncryptUpdate(self.ptr, ptr, ctypes.byref(written), ptr, n)
            if ok != 1 or written.value != n:
                raise OSError("EVP_EncryptUpdate failed")


def _load() -> tuple[ctypes.CDLL, int] | None:
    lib: ctypes.CDLL | None = None
    try:
        lib = ctypes.CDLL("libcrypto.so.3")
    except OSError:  # not Linux's name: ask the platform (runs a helper program)
        name = ctypes.util.find_library("crypto")
        with contextlib.suppress(OSError):
            lib = ctypes.CDLL(name) if name else None
    if lib is None:
        return None
    try:
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        lib.OSSL_LIB_CTX_new.restype = vp
        lib.OSSL_PROVIDER_load.restype = vp
        lib.OSSL_PROVIDER_load.argtypes = [vp, cp]
        lib.EVP_CIPHER_fetch.restype = vp
        lib.EVP_CIPHER_fetch.argtypes = [vp, cp, cp]
        lib.EVP_CIPHER_CTX_new.restype = vp
        lib.EVP_CIPHER_CTX_free.argtypes = [vp]
        lib.EVP_CIPHER_CTX_set_padding.argtypes = [vp, ctypes.c_int]
        lib.EVP_EncryptInit_ex.argtypes = [vp, vp, vp, cp, cp]
        lib.EVP_EncryptUpdate.argtypes = [vp, vp, ctypes.POINTER(ctypes.c_int), vp, ctypes.c_int]
    except AttributeError:  # not OpenSSL 3
        return None
    libctx = lib.OSSL_LIB_CTX_new()
    if not libctx or not lib.OSSL_PROVIDER_load(libctx, b"legacy"):
        return None
    cipher = lib.EVP_CIPHER_fetch(libctx, b"DES-ECB", None)
    return (lib, cipher) if cipher else None


def _triple_des(plain: bytes) -> bytes:
    from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
    from cryptography.hazmat.primitives.ciphers import Cipher, modes

    out: bytes = Cipher(TripleDES(bytes(24)), modes.ECB()).encryptor().update(plain)
    return out


class BulkDES:
    """Single null-key DES-ECB over whole blocks, one OpenSSL context per thread."""

    def __init__(self, lib: ctypes.CDLL, cipher: int) -> None:
        self._lib, self._cipher = lib, cipher
        self._local = threading.local()

    def _ctx(self) -> _Context:
        ctx: _Context | None = getattr(self._local, "ctx", None)
        if ctx is None:
            ctx = self._local.ctx = _Context(self._lib, self._cipher)
        return ctx

    def encrypt(self, plain: bytes) -> bytes:
        """The encryption of ``plain`` (a multiple of 8 bytes long)."""
        return self._ctx().encrypt(plain)

    def encrypt_inplace(self, buf: bytearray | memoryview) -> None:
        """Encrypt ``buf`` (writable, a multiple of 8 bytes long) in place."""
        self._ctx().encrypt_inplace(buf)


@lru_cache(maxsize=1)
def bulk_des() -> BulkDES | None:
    """Single DES from OpenSSL, or None if it cannot give it.

    It is used only after it agreed with 3DES (``cryptography``) on a test input.
    """
    loaded = _load()
    if loaded is None:
        return None
    des = BulkDES(*loaded)
    probe = bytes(range(256)) * 4
    try:
        if des.encrypt(probe) != _triple_des(probe):
            return None
    except OSError:
        return None
    return des
