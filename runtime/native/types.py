"""The names annotations use for cffi's values."""
from __future__ import annotations

from typing import Any

# A cdata's fields and a lib's functions come from the cdef text at run time, so no static type
# describes them: types-cffi's CData and Lib have no such attributes. Any, under names that say
# what the value is.
CData = Any   # a cffi cdata: a slot, a store context, a wasmtime handle, a pointer
CLib = Any    # a cffi lib: libwasmtime or the hot path's library, through dlopen
CFFI = Any    # a cffi FFI of hand-written declarations: the cdata it makes have their fields
